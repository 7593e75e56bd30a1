// Package taptest is an in-memory TAP for tests of code that drives a TAP: the
// datapath engine and everything built on it. It behaves like a tapdev.Device opened
// with IFF_VNET_HDR as far as its callers can tell without a kernel: ReadBatch hands out
// injected packets (vnet header + frame) in order and blocks until one is there or the
// TAP is closed; Write records what was written, or refuses it as a kernel would when
// told to (Refuse); SetOffloads records the read-offload mask within what the TAP
// "kernel" offers, as TUNSETOFFLOAD does.
package taptest

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// TAP is an in-memory TAP. The zero value is not usable; call New.
type TAP struct {
	// Probed is what the fake kernel accepts in TUNSETOFFLOAD; Accept what it takes on
	// write. Set them before handing the TAP to its user.
	Probed, Accept vnethdr.Offloads

	// Refuse, when set, is asked about every Write first: a non-nil error (unix.EINVAL,
	// as the kernel answers a virtio_net_hdr it rejects) is the write's result, and the
	// packet is neither counted in Writes nor kept, only counted in Refusals. Set it
	// before handing the TAP to its user.
	Refuse func(pkt []byte) error

	in        chan []byte
	closed    chan struct{}
	closeOnce sync.Once
	stats     tapdev.Stats

	mu    sync.Mutex
	out   [][]byte
	count int
	keep  bool
	mask  vnethdr.Offloads
	sets  int
	nrefd int

	// The vectored side (vectored.go): the reader's packet WaitReadable took off the
	// queue (reader-only), the read deadline and its wake-up, the header length and the
	// queue's attachment.
	peek     []byte
	rdl      time.Time
	rkick    chan struct{}
	wrote    chan struct{}
	hdrLen   int
	detached bool
}

// New returns a TAP whose kernel offers every offload; keep says whether written packets
// are kept for Written (a benchmark only counts them).
func New(keep bool) *TAP {
	all := vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN | vnethdr.OffloadUSO
	return &TAP{Probed: all, Accept: all, in: make(chan []byte, 1024), closed: make(chan struct{}), keep: keep,
		rkick: make(chan struct{}, 1), wrote: make(chan struct{}, 1), hdrLen: vnethdr.LenMrgRxbuf}
}

// Inject queues one packet (vnet header + frame) for ReadBatch. It blocks while the
// queue is full; once the TAP is closed it may give up instead, and reports whether the
// packet was queued.
func (t *TAP) Inject(pkt []byte) bool {
	select {
	case t.in <- pkt:
		return true
	case <-t.closed:
		return false
	}
}

// Queued is how many injected packets ReadBatch has not handed out yet.
func (t *TAP) Queued() int { return len(t.in) }

// ReadBatch implements the TAP read side: at least one packet, then whatever is queued.
func (t *TAP) ReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	if p := t.peek; p != nil {
		t.peek = nil
		sizes[0] = copy(bufs[0][offset:], p)
	} else {
		select {
		case p := <-t.in:
			sizes[0] = copy(bufs[0][offset:], p)
		case <-t.closed:
			return 0, os.ErrClosed
		}
	}
	n := 1
	for n < len(bufs) {
		select {
		case p := <-t.in:
			sizes[n] = copy(bufs[n][offset:], p)
			n++
		default:
			return n, nil
		}
	}
	return n, nil
}

// Write records pkt, unless Refuse refuses it.
func (t *TAP) Write(pkt []byte) (int, error) {
	if t.Refuse != nil {
		if err := t.Refuse(pkt); err != nil {
			t.mu.Lock()
			t.nrefd++
			t.mu.Unlock()
			return 0, err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.count++
	if t.keep {
		t.out = append(t.out, bytes.Clone(pkt))
		select {
		case t.wrote <- struct{}{}:
		default:
		}
	}
	return len(pkt), nil
}

// Writev is Write of the concatenation of iov, as tapdev.Device.Writev writes one
// frame gathered from several buffers. Without Refuse or keep nothing is copied, so a
// benchmark's writes allocate nothing.
func (t *TAP) Writev(iov [][]byte) (int, error) {
	if t.Refuse == nil && !t.keep {
		n := 0
		for _, b := range iov {
			n += len(b)
		}
		t.mu.Lock()
		t.count++
		t.mu.Unlock()
		return n, nil
	}
	var pkt []byte
	for _, b := range iov {
		pkt = append(pkt, b...)
	}
	return t.Write(pkt)
}

// Writes is how many packets were written so far.
func (t *TAP) Writes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count
}

// Refusals is how many writes Refuse refused so far.
func (t *TAP) Refusals() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nrefd
}

// Written returns the packets written so far (with keep).
func (t *TAP) Written() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]byte(nil), t.out...)
}

// LinkInfo reports a fixed MAC and 198.18.0.1/24.
func (t *TAP) LinkInfo() (net.HardwareAddr, []netip.Prefix, error) {
	return net.HardwareAddr{2, 0, 0, 0, 0, 1}, []netip.Prefix{netip.MustParsePrefix("198.18.0.1/24")}, nil
}

// Stats are the TAP's counters (left at zero: nothing here makes system calls).
func (t *TAP) Stats() *tapdev.Stats { return &t.stats }

// Close unblocks ReadBatch for good.
func (t *TAP) Close() error {
	t.closeOnce.Do(func() { close(t.closed) })
	return nil
}

// Name is "tgtest0".
func (t *TAP) Name() string { return "tgtest0" }

// ProbeOffloads is Probed.
func (t *TAP) ProbeOffloads() vnethdr.Offloads { return t.Probed }

// Accepts is Accept.
func (t *TAP) Accepts() vnethdr.Offloads { return t.Accept }

// SetOffloads sets the read mask to o within Probed, normalised as the kernel does.
func (t *TAP) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mask, t.sets = (o & t.Probed).Normalize(), t.sets+1
	return t.mask, nil
}

// Offloads is the read mask last set.
func (t *TAP) Offloads() vnethdr.Offloads {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mask
}

// Sets is how many times SetOffloads was called (TUNSETOFFLOAD system calls, on a
// real TAP).
func (t *TAP) Sets() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sets
}

// Forget drops the packets recorded so far (Written starts afresh; Writes keeps counting).
func (t *TAP) Forget() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = t.out[:0]
}
