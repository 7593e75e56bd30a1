//go:build linux

package vnethdr

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSumNoReadPastEnd puts the data at the very end of a readable page followed by a
// PROT_NONE page, so any load past the end of the slice (a vector load over the tail,
// say) faults and kills the test. Same for the destination of SumCopy.
func TestSumNoReadPastEnd(t *testing.T) {
	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 4*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer unix.Munmap(mem)
	// Layout: [src page][guard][dst page][guard].
	if err := unix.Mprotect(mem[page:2*page], unix.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	if err := unix.Mprotect(mem[3*page:], unix.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	srcPage, dstPage := mem[:page:page], mem[2*page:3*page:3*page]
	for i := range srcPage {
		srcPage[i] = byte(i*31 + 7)
	}
	sumPaths(t, func(t *testing.T) {
		for n := 0; n <= 700; n++ {
			src := srcPage[page-n:]
			dst := dstPage[page-n:]
			want := refFoldedSum(src, 0)
			if got := Fold(Sum(src, 0)); got != want {
				t.Fatalf("len %d at page end: Fold(Sum) %#04x, reference %#04x", n, got, want)
			}
			if got := Fold(SumCopy(dst, src, 0)); got != want {
				t.Fatalf("len %d at page end: Fold(SumCopy) %#04x, reference %#04x", n, got, want)
			}
		}
	})
}
