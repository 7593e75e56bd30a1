//go:build linux

package vhostuser

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
)

// TestLogWrote: logging is on exactly while LOG_ALL is acked and the ring's address
// says VHOST_VRING_F_LOG; then a chain the device wrote into and handed back (Wrote,
// Rewind) has the pages of those bytes marked, split over its descriptors by their
// guest-physical addresses, and nothing else (End wrote nothing to the used ring).
// A SET_VRING_ADDR that would move a running ring is refused; one that only turns the
// log flag on or off is taken.
func TestLogWrote(t *testing.T) {
	h := startSession(t, opts{})
	v, r := h.vr[0], h.Rings[0]
	if v.Logging() {
		t.Fatal("logging before any migration")
	}
	l := h.StartLog()
	if !v.Logging() || !h.vr[1].Logging() {
		t.Fatal("logging off after StartLog")
	}
	a := h.G.Alloc(3*vhostusertest.LogPage, vhostusertest.LogPage)
	head := r.AddChain([]vhostusertest.Seg{{GPA: a + 100, Len: 5000, Write: true}, {GPA: a + 2*vhostusertest.LogPage, Len: 4096, Write: true}})
	r.Publish(head)
	l.Collect()
	iov := make([][]byte, 0, 8)
	batch(t, v, func() {
		c, err := v.Pop(iov)
		if err != nil {
			t.Fatal(err)
		}
		v.Wrote(c.Head, 5000+10) // all of the first descriptor, 10 bytes of the second
		v.Rewind(1)
	})
	got := l.Collect()
	// Nothing was pushed, so End wrote nothing into the used ring.
	want := []uint64{a / vhostusertest.LogPage, a/vhostusertest.LogPage + 1, a/vhostusertest.LogPage + 2}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("marked pages %v, want %v", got, want)
	}

	// Moving a running ring is refused, the log flag alone is not.
	p := vhostusertest.AddrPayload(r)
	binary.LittleEndian.PutUint64(p[8:], binary.LittleEndian.Uint64(p[8:])+4096)
	if ack := h.FE.Ack(ReqSetVringAddr, p); ack == 0 {
		t.Fatal("SET_VRING_ADDR moving a running ring was accepted")
	}
	h.StopLog()
	if v.Logging() {
		t.Fatal("logging on after StopLog")
	}
	batch(t, v, func() {
		c, _ := v.Pop(iov)
		v.Wrote(c.Head, 100)
		v.Rewind(1)
	})
	if got := l.Collect(); len(got) != 0 {
		t.Fatalf("pages marked with logging off: %v", got)
	}
}

// TestLogBaseRefused: a log that cannot be mapped safely ends the session (QEMU would
// migrate on without it), the fd closed; the next session is served.
func TestLogBaseRefused(t *testing.T) {
	memfd := func(size int) int {
		fd, _ := unix.MemfdCreate("log", unix.MFD_CLOEXEC)
		unix.Ftruncate(fd, int64(size))
		return fd
	}
	for _, tc := range []struct {
		name         string
		fd           func() int
		size, offset uint64
		why          string
	}{
		{"pipe", func() int { var p [2]int; unix.Pipe2(p[:], unix.O_CLOEXEC); unix.Close(p[1]); return p[0] }, 4096, 0, "not a regular file"},
		{"file-too-small", func() int { return memfd(1024) }, 4096, 0, "passes the end"},
		{"offset-misaligned", func() int { return memfd(8192) }, 4096, 4, "not 8-aligned"},
		{"empty", func() int { return memfd(4096) }, 0, 0, "log of 0 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := openFds(t)
			h := startSession(t, opts{})
			fd := tc.fd()
			p := binary.LittleEndian.AppendUint64(nil, tc.size)
			p = binary.LittleEndian.AppendUint64(p, tc.offset)
			h.FE.Send(ReqSetLogBase, vuproto.FlagVersion, p, fd)
			unix.Close(fd)
			select {
			case err := <-h.done:
				h.done <- err
				if err == nil || !strings.Contains(err.Error(), "SET_LOG_BASE") || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("session ended with %v, want SET_LOG_BASE: …%s…", err, tc.why)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the session went on with a bad log")
			}
			h.Close()
			// The test holds the guest memfd and three eventfds per ring.
			if after, held := openFds(t), 1+3*len(h.Rings); after != before+held {
				t.Fatalf("fds: %d before, %d after, test holds %d", before, after, held)
			}
		})
	}
}
