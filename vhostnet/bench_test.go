//go:build linux

package vhostnet

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

const benchBatch = 64

// BenchmarkTX: the guest republishes the same 64 chains of 1514-byte frames (header and
// frame in separate descriptors, as Linux sends them) and waits for them to be used.
// ns/op, B/op and allocs/op are per frame, the datapath's goroutines included.
//
// The /log variants run with a migration's dirty logging on (StartLog, as QEMU turns it
// on), so the used-ring writes are marked too: the cost of logging.
func BenchmarkTX(b *testing.B) {
	for _, c := range []struct {
		size int
		log  bool
	}{{1514, false}, {65535, false}, {1514, true}, {65535, true}} {
		name := map[int]string{1514: "1514", 65535: "64k"}[c.size]
		if c.log {
			name += "/log"
		}
		size := c.size
		b.Run(name, func(b *testing.B) {
			e := newKernelEnv(b, vhostusertest.Options{}, Config{})
			if c.log {
				e.s.StartLog()
			}
			unix.Close(e.ps) // nobody reads: do not make the kernel copy for a socket
			e.ps = -1
			tx := e.s.TX(0)
			heads := make([]uint16, benchBatch)
			for i := range heads {
				f := testFrame(e.mac, gMAC, size, uint32(i), 8)
				heads[i] = tx.PrepareFrame(append(make([]byte, 12), f...), []int{12}, false)
			}
			b.ReportAllocs()
			b.SetBytes(int64(size))
			e.runTXBatches(b, heads)
			if e.n.Stats().Drops[DropTXTAP].Load() != 0 {
				b.Fatalf("TAP refused frames: %v", e.stats())
			}
		})
	}
}

// BenchmarkRX: a UDP socket in the namespace sends 64 datagrams (1514-byte frames)
// through the TAP, the guest waits for them in 4 KiB mergeable buffers and reposts
// those chains. Per frame, the datapath's goroutines included.
func BenchmarkRX(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchRX(b, false) })
	// With a migration's dirty logging on: each frame's receive buffer and used entry
	// are marked (the log's bits are never collected here, so the ORs find them set, as
	// between two of QEMU's passes).
	b.Run("log", func(b *testing.B) { benchRX(b, true) })
}

func benchRX(b *testing.B, log bool) {
	e := newKernelEnv(b, vhostusertest.Options{}, Config{})
	if log {
		e.s.StartLog()
	}
	e.ns.MustRun(b, "ip", "neigh", "replace", guestIP.String(), "lladdr", gMAC.String(), "dev", tapName, "nud", "permanent")
	var fd int
	if err := e.ns.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16<<20)
		return unix.Connect(fd, &unix.SockaddrInet4{Port: 9, Addr: netip.MustParseAddr("198.18.0.2").As4()})
	}); err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	payload := make([]byte, 1514-42)
	rx := e.s.RX(0)
	heads := rx.PostRX(rx.Free(), 4096, 1)
	rx.KickNow()
	b.ReportAllocs()
	b.SetBytes(1514)
	b.ResetTimer()
	k := 0
	for i := 0; i < b.N; i += benchBatch {
		target := rx.UsedIdx() + benchBatch
		for range benchBatch {
			if _, err := unix.Write(fd, payload); err != nil {
				b.Fatal(err)
			}
		}
		if !rx.WaitUsed(target, 10*time.Second) {
			b.Fatalf("RX frames not delivered (stats %v)", e.stats())
		}
		rx.DrainUsed()
		rx.Republish(heads[k : k+benchBatch])
		k = (k + benchBatch) % len(heads)
		rx.KickNow()
	}
	b.StopTimer()
	if e.n.Stats().RXChains.Load() != e.n.Stats().RXFrames.Load() {
		b.Fatalf("frames took more than one 4 KiB buffer: %v", e.stats())
	}
}

// BenchmarkTXGRO: as BenchmarkTX/1514, but the frames are one flow's MTU TCP segments
// (1448 payload bytes, contiguous sequence numbers within the 64) and GRO is on: the
// engine merges them into GSO packets for the TAP (batch flush). Per guest frame.
func BenchmarkTXGRO(b *testing.B) {
	for _, partial := range []bool{false, true} {
		b.Run(map[bool]string{false: "csum", true: "needs_csum"}[partial], func(b *testing.B) {
			e := newKernelEnv(b, vhostusertest.Options{}, Config{GRO: true})
			unix.Close(e.ps)
			e.ps = -1
			tx := e.s.TX(0)
			heads := make([]uint16, benchBatch)
			for i := range heads {
				f, h := tcpSeg(e.mac, gMAC, guestIP, farIP, 40000, 5001, uint32(i*mss), 1, tcpACK, uint16(i), streamBytes(0, i*mss, mss), partial)
				data := make([]byte, 12+len(f))
				h.Encode(data, 12)
				copy(data[12:], f)
				heads[i] = tx.PrepareFrame(data, []int{12}, false)
			}
			b.ReportAllocs()
			b.SetBytes(14 + 40 + mss)
			e.runTXBatches(b, heads)
			g := &e.n.Stats().GRO
			if e.n.Stats().Drops[DropTXTAP].Load() != 0 || g.GSOOut.Load() == 0 {
				b.Fatalf("TAP refused frames or nothing merged: %v, gso packets %d", e.stats(), g.GSOOut.Load())
			}
			b.ReportMetric(float64(g.Segments.Load())/float64(g.Packets.Load()), "segs/packet")
		})
	}
}

// BenchmarkRXRSC: the TAP's offloads capped to none (--offload off), a packet socket
// injects 64 MTU TCP segments of one flow through the TAP per round, and the guest
// (GUEST_TSO4, 4 KiB mergeable buffers) receives them coalesced. Per TAP frame, the
// injection's system calls included, and the test's own allocations (the double's
// PostRX slice, once per round): the datapath allocates nothing in steady state.
func BenchmarkRXRSC(b *testing.B) {
	off := vnethdr.Choice{}
	e := newKernelEnv(b, vhostusertest.Options{}, Config{GRO: true, Offload: &off})
	frames := make([][]byte, benchBatch)
	for i := range frames {
		frames[i] = rxTCP(e, 41000, uint32(i*mss), tcpACK, uint16(i), streamBytes(0, i*mss, mss))
	}
	rx := e.s.RX(0)
	rx.PostRX(rx.Free(), 4096, 1)
	rx.KickNow()
	r := &e.n.Stats().RSC
	round := func() {
		seg := r.Segments.Load() + benchBatch
		for _, f := range frames {
			if err := e.injectTAP(f); err != nil {
				b.Fatal(err)
			}
		}
		for deadline := time.Now().Add(10 * time.Second); r.Segments.Load() < seg || e.n.Stats().RXWaiting.Load(); {
			if time.Now().After(deadline) {
				b.Fatalf("RX frames not delivered (stats %v)", e.stats())
			}
			rx.WaitCall(time.Millisecond)
			rx.ReapFunc(nil)
			if k := rx.Free(); k >= 64 {
				rx.PostRX(k, 4096, 1) // the double's one slice per call is in B/op
				rx.KickNow()
			}
		}
	}
	round() // the engine is allocated (4 MB) on the first batch that needs it
	b.ReportAllocs()
	b.SetBytes(14 + 40 + mss)
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		round()
	}
	b.StopTimer()
	if r.GSOOut.Load() == 0 {
		b.Fatalf("nothing coalesced: %v", e.stats())
	}
	b.ReportMetric(float64(r.Segments.Load())/float64(r.Packets.Load()), "segs/packet")
}

// runTXBatches times b.N guest frames: the prepared chains heads are made available
// again, kicked and waited for, benchBatch at a time.
func (e *env) runTXBatches(b *testing.B, heads []uint16) {
	tx := e.s.TX(0)
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		target := tx.UsedIdx() + benchBatch
		tx.Republish(heads)
		tx.KickNow()
		if !tx.WaitUsed(target, 10*time.Second) {
			b.Fatalf("TX chains not used (stats %v)", e.stats())
		}
		tx.DrainUsed()
	}
	b.StopTimer()
}

// BenchmarkRXUSO: the host sends 40 datagrams of 1400 bytes with one UDP_SEGMENT
// sendmsg; per send, until the guest has them all. whole: the guest acked GUEST_USO4/6
// and takes the GSO frame as it is; cut-here: it did not, the TAP hands the packet over
// whole and tapgro cuts it (split.go); cut-by-kernel: the same guest with --offload
// capping USO off, so the kernel cuts it before the TAP and tapgro reads 40 frames.
// ns/op is wall time; cpu-ns/op the whole test process's CPU (the sending kernel, tapgro
// and the double), which is what the choice between the two cutters moves.
func BenchmarkRXUSO(b *testing.B) {
	noUSO := uint64(1)<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6
	for _, bc := range []struct {
		name string
		mask uint64
		cfg  Config
	}{
		{"whole", 0, Config{}},
		{"cut-here", noUSO, Config{}},
		{"cut-by-kernel", noUSO, Config{Offload: &vnethdr.Choice{Set: vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newKernelEnv(b, vhostusertest.Options{AckMask: bc.mask}, bc.cfg)
			if e.n.probed&vnethdr.OffloadUSO != vnethdr.OffloadUSO {
				b.Skip("the TAP refuses TUN_F_USO4/6 (kernel before 6.2)")
			}
			unix.Close(e.ps)
			e.ps = -1
			e.ns.MustRun(b, "ip", "neigh", "replace", guestIP.String(), "lladdr", gMAC.String(), "dev", tapName, "nud", "permanent")
			var fd int
			if err := e.ns.Do(func() (err error) {
				if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
					return err
				}
				if err = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT, usoSize); err != nil {
					return err
				}
				return unix.Connect(fd, &unix.SockaddrInet4{Port: usoPort, Addr: guestIP.As4()})
			}); err != nil {
				b.Fatal(err)
			}
			defer unix.Close(fd)
			payload := usoPayload(usoSegs * usoSize)
			rx := e.s.RX(0)
			rx.PostRX(rx.Free(), 4096, 1)
			rx.KickNow()
			// Reaped chains are made available again as they are (no allocation in the
			// double, so allocs/op is tapgro's).
			reaped := make([]uint16, 0, rx.Num)
			seen := rx.Reaped()
			st := e.n.Stats()
			round := func() {
				want := st.RXBytes.Load() + uint64(len(payload)+usoSegs*42)
				if bc.mask == 0 {
					want = st.RXBytes.Load() + uint64(len(payload)+42)
				}
				if _, err := unix.Write(fd, payload); err != nil {
					b.Fatal(err)
				}
				for deadline := time.Now().Add(10 * time.Second); st.RXBytes.Load() < want; {
					if time.Now().After(deadline) {
						b.Fatalf("datagrams not delivered (stats %v)", e.stats())
					}
					rx.WaitCall(time.Millisecond)
					for idx := rx.UsedIdx(); seen != idx; seen++ {
						reaped = append(reaped, rx.UsedAt(seen).ID)
					}
					rx.DrainUsed()
					if len(reaped) >= 64 {
						rx.Republish(reaped)
						reaped = reaped[:0]
						rx.KickNow()
					}
				}
			}
			round()
			var r0, r1 unix.Rusage
			unix.Getrusage(unix.RUSAGE_SELF, &r0)
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for range b.N {
				round()
			}
			b.StopTimer()
			unix.Getrusage(unix.RUSAGE_SELF, &r1)
			cpu := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) * time.Nanosecond
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			if cut := st.GSOSegmented.Load(); (bc.name == "cut-here") != (cut > 0) {
				b.Fatalf("%s: GSOSegmented %d", bc.name, cut)
			}
		})
	}
}
