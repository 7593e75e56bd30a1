//go:build linux

package vhostuser

// Copying between a chain's segments and a flat buffer.

// CopyFrom copies the concatenation of iov, skipping the first skip bytes, into dst and
// returns the bytes copied. A helper for reading a header split over descriptors.
func CopyFrom(dst []byte, iov [][]byte, skip int) int {
	n := 0
	for _, s := range iov {
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		c := copy(dst[n:], s[skip:])
		n += c
		skip = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// AppendFrom appends to dst the views of iov's bytes from skip on (the concatenation's
// tail, where it lies, not copied) and returns it.
func AppendFrom(dst, iov [][]byte, skip int) [][]byte {
	for _, s := range iov {
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		dst = append(dst, s[skip:])
		skip = 0
	}
	return dst
}

// CopyTo copies src into the concatenation of iov from its start and returns the bytes
// copied.
func CopyTo(iov [][]byte, src []byte) int {
	n := 0
	for _, s := range iov {
		if n == len(src) {
			break
		}
		n += copy(s, src[n:])
	}
	return n
}
