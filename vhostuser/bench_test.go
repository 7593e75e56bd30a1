//go:build linux

package vhostuser

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
)

// BenchmarkTX pops and pushes TX chains (header descriptor + frame descriptor), batch
// chains per Begin/End, one call per batch. ns/op and allocs/op are per chain.
func BenchmarkTX(b *testing.B) {
	for _, bs := range []int{1, 32} {
		b.Run(map[int]string{1: "batch1", 32: "batch32"}[bs], func(b *testing.B) {
			h := startSession(b, opts{num: 256})
			r, v := h.Rings[1], h.vr[1]
			buf := h.G.Alloc(1600, 64)
			heads := make([]uint16, bs)
			for i := range heads {
				heads[i] = r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 12}, {GPA: buf + 12, Len: 1514}})
			}
			iov := make([][]byte, 0, 64)
			b.ReportAllocs()
			b.SetBytes(1526)
			b.ResetTimer()
			for i := 0; i < b.N; i += bs { // one op = one chain
				r.Republish(heads)
				if err := v.Begin(); err != nil {
					b.Fatal(err)
				}
				for range heads {
					c, err := v.Pop(iov)
					if err != nil {
						b.Fatal(err)
					}
					v.Push(c.Head, 0)
				}
				v.End()
				r.Called()
			}
		})
	}
}

// BenchmarkRX fills receive chains as a device's receive path does: pop a 1536-byte
// chain, copy a 1514-byte frame in, push it; 32 per batch, one publish per batch.
// ns/op and allocs/op are per frame. Frames over several chains (MRG_RXBUF) are the
// net device's: vhostnet BenchmarkReservation.
func BenchmarkRX(b *testing.B) {
	h := startSession(b, opts{num: 256})
	r, v := h.Rings[0], h.vr[0]
	heads := make([]uint16, 128)
	for i := range heads {
		heads[i] = r.AddChain([]vhostusertest.Seg{{GPA: h.G.Alloc(1536, 64), Len: 1536, Write: true}})
	}
	frame := make([]byte, 12+1514)
	const frames = 32
	iov := make([][]byte, 0, 8)
	cur := 0
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	b.ResetTimer()
	for i := 0; i < b.N; i += frames {
		for range frames {
			r.Republish(heads[cur : cur+1])
			cur = (cur + 1) % len(heads)
		}
		if err := v.Begin(); err != nil {
			b.Fatal(err)
		}
		for range frames {
			if err := fillRX(v, iov, frame); err != nil {
				b.Fatal(err)
			}
		}
		v.End()
		r.Called()
	}
}

// BenchmarkIdlePolledRing measures what a ring with no kick fd (SET_VRING_KICK with
// VHOST_USER_VRING_NOFD_MASK, so the worker polls) costs while the guest sends nothing,
// beside the same idle ring waiting on its kick eventfd: one op is 100 ms of idleness,
// %cpu the whole test process's CPU time over it (getrusage).
func BenchmarkIdlePolledRing(b *testing.B) {
	for _, polled := range []bool{false, true} {
		b.Run(map[bool]string{false: "kick", true: "polled"}[polled], func(b *testing.B) { benchIdleRing(b, polled) })
	}
}

func benchIdleRing(b *testing.B, polled bool) {
	h := startSession(b, opts{skipKick: true})
	if polled {
		h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1|vuproto.VringNoFd))
	} else {
		h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1), h.Rings[1].Kick)
	}
	v := <-h.rec.started
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v.Wait() == nil {
			if v.Begin() == nil {
				v.Pop(make([][]byte, 0, 8))
				v.End()
			}
		}
	}()
	time.Sleep(50 * time.Millisecond) // past the back-off's first steps
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		time.Sleep(100 * time.Millisecond)
	}
	b.StopTimer()
	wall := time.Since(start)
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%cpu")
	h.Stop()
	<-done
}

// BenchmarkWakeUp is the price of one hop between threads on this host, the unit a
// round trip through a vhost-user back-end is paid in: two OS threads hand a token back
// and forth through two eventfds, each sleeping in a blocking read(2) until the other's
// write(2) wakes it, as a kick wakes a ring worker and a call wakes the thread that
// injects the guest's interrupt. ns/op is one round trip, two wake-ups; µs/wake is half.
func BenchmarkWakeUp(b *testing.B) {
	var efd [2]int
	for i := range efd {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC) // blocking: the reader sleeps in the kernel
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		efd[i] = fd
	}
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		var buf [8]byte
		for {
			if _, err := unix.Read(efd[0], buf[:]); err != nil {
				return
			}
			select {
			case <-stop:
				return
			default:
			}
			unix.Write(efd[1], one)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var buf [8]byte
	b.ResetTimer()
	for range b.N {
		unix.Write(efd[0], one)
		unix.Read(efd[1], buf[:])
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(2*b.N), "µs/wake")
	close(stop)
	unix.Write(efd[0], one) // let the partner see stop
	<-done                  // before the deferred Close: a reused fd number must not reach it
}
