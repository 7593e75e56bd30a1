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
