//go:build linux

// Package main is udpbulk, the UDP bulk sender and receiver of the QEMU benchmark rows and
// tests. It is built static (CGO_ENABLED=0) so it runs in the test guest, which has no
// libc, as well as on the host.
//
//	udpbulk send -to ADDR:PORT [-t SECS] [-size BYTES] [-gso N]
//	udpbulk recv -on ADDR:PORT [-bursts N] [-idle SECS] [-max SECS]
//
// iperf3's UDP mode writes one datagram per system call and has no way to ask for UDP
// segmentation offload, which is the case a Linux ≥ 6.2 guest's QUIC, WireGuard or VXLAN
// sender produces. With -gso N the sender sets UDP_SEGMENT to -size and writes N
// datagrams per send: the kernel builds one UDP GSO packet (gso_type SKB_GSO_UDP_L4) that
// is segmented wherever the next hop cannot take it whole — in the guest's own stack when
// the NIC did not negotiate VIRTIO_NET_F_HOST_USO, or later (net/ipv4/udp_offload.c
// __udp_gso_segment). -gso 1 is one datagram per send.
//
// Every datagram carries its sequence number and a payload derived from it, and the
// receiver checks every byte: the rows count corrupted datagrams beside the lost ones,
// so a relay that mangles a segment boundary shows up as "bad", not as throughput.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// patterns is the number of distinct payloads; datagram seq carries payload seq%patterns,
// so the sender copies a precomputed one instead of generating bytes (a TCG guest pays
// for every instruction).
const patterns = 251

// hdrLen is the sequence number at the start of every datagram.
const hdrLen = 8

func payloads(size int) [][]byte {
	p := make([][]byte, patterns)
	for k := range p {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(k*7 + i*13 + i>>8)
		}
		p[k] = b
	}
	return p
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "send":
		err = send(os.Args[2:])
	case "recv":
		err = recv(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpbulk:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: udpbulk send -to ADDR:PORT [-t SECS] [-size BYTES] [-gso N]\n       udpbulk recv -on ADDR:PORT [-bursts N] [-idle SECS] [-max SECS]")
	os.Exit(2)
}

func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	to := fs.String("to", "", "receiver ADDR:PORT")
	secs := fs.Float64("t", 5, "seconds to send")
	size := fs.Int("size", 1400, "UDP payload bytes per datagram")
	gso := fs.Int("gso", 1, "datagrams per send (> 1 sets UDP_SEGMENT)")
	fs.Parse(args)
	if *to == "" {
		return errors.New("send: -to is required")
	}
	if *size < hdrLen || *size > 65507 {
		return fmt.Errorf("send: -size %d outside [%d, 65507]", *size, hdrLen)
	}
	// The IP payload of the whole GSO packet must fit in 64 KB (udp_send_skb refuses
	// more), and the kernel takes at most UDP_MAX_SEGMENTS (64 before Linux 6.6's 128).
	if *gso < 1 || *gso > 64 || *gso**size+8 > 65507 {
		return fmt.Errorf("send: -gso %d with -size %d: a send must stay within 64 segments and 64 KB", *gso, *size)
	}
	c, err := net.Dial("udp", *to)
	if err != nil {
		return err
	}
	defer c.Close()
	uc := c.(*net.UDPConn)
	if *gso > 1 {
		raw, err := uc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, *size)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("send: UDP_SEGMENT: %w", serr)
		}
	}
	pat := payloads(*size)
	buf := make([]byte, *gso**size)
	var seq, bytes, sends, refused uint64
	start := time.Now()
	deadline := start.Add(time.Duration(*secs * float64(time.Second)))
	for time.Now().Before(deadline) {
		for i := 0; i < *gso; i++ {
			d := buf[i**size : (i+1)**size]
			copy(d, pat[(seq+uint64(i))%patterns])
			binary.BigEndian.PutUint64(d, seq+uint64(i))
		}
		if _, err := uc.Write(buf); err != nil {
			// A receiver not yet bound (or a full queue, ENOBUFS) costs datagrams, not
			// the run: the receiver's count is the measure.
			if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOBUFS) {
				refused++
				continue
			}
			return fmt.Errorf("send: %w", err)
		}
		seq += uint64(*gso)
		bytes += uint64(len(buf))
		sends++
	}
	el := time.Since(start).Seconds()
	fmt.Printf("udpbulk: sent datagrams=%d bytes=%d sends=%d refused=%d seconds=%.3f gbps=%.3f\n",
		seq, bytes, sends, refused, el, float64(bytes)*8/el/1e9)
	return nil
}

func recv(args []string) error {
	fs := flag.NewFlagSet("recv", flag.ExitOnError)
	on := fs.String("on", "", "ADDR:PORT to bind")
	idle := fs.Float64("idle", 1.5, "a burst ends this many seconds after its last datagram")
	bursts := fs.Int("bursts", 1, "bursts to receive (one result line each) before exiting")
	max := fs.Float64("max", 60, "stop after this many seconds in all")
	fs.Parse(args)
	if *on == "" {
		return errors.New("recv: -on is required")
	}
	la, err := net.ResolveUDPAddr("udp", *on)
	if err != nil {
		return err
	}
	c, err := net.ListenUDP("udp", la)
	if err != nil {
		return err
	}
	defer c.Close()
	// A deep socket buffer so a burst the reader falls behind on is queued, not dropped
	// before it is counted (the kernel caps it at net.core.rmem_max).
	c.SetReadBuffer(8 << 20)
	fmt.Println("udpbulk: ready")
	idleFor := time.Duration(*idle * float64(time.Second))
	end := time.Now().Add(time.Duration(*max * float64(time.Second)))
	var b burst
	buf := make([]byte, 65536)
	for done := 0; done < *bursts; {
		dl := end
		if !b.last.IsZero() && b.last.Add(idleFor).Before(dl) {
			dl = b.last.Add(idleFor)
		}
		c.SetReadDeadline(dl)
		m, _, err := c.ReadFromUDP(buf)
		if err == nil {
			b.add(buf[:m])
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("recv: %w", err)
		}
		if b.n > 0 {
			b.report()
			done++
		}
		if !time.Now().Before(end) {
			break
		}
		b = burst{pat: b.pat}
	}
	return nil
}

// burst counts one run of datagrams: the sender's sequence numbers start at 0 each time.
type burst struct {
	pat                   [][]byte
	n, bytes, bad, maxSeq uint64
	first, last           time.Time
}

func (b *burst) add(d []byte) {
	now := time.Now()
	if b.first.IsZero() {
		b.first = now
	}
	b.last = now
	b.n++
	b.bytes += uint64(len(d))
	if len(d) < hdrLen {
		b.bad++
		return
	}
	if b.pat == nil || len(b.pat[0]) != len(d) {
		b.pat = payloads(len(d))
	}
	seq := binary.BigEndian.Uint64(d)
	if seq >= 1<<40 || string(d[hdrLen:]) != string(b.pat[seq%patterns][hdrLen:]) {
		b.bad++
		return
	}
	b.maxSeq = max64(b.maxSeq, seq+1)
}

func (b *burst) report() {
	el := b.last.Sub(b.first).Seconds()
	gbps := 0.0
	if el > 0 {
		gbps = float64(b.bytes) * 8 / el / 1e9
	}
	// Lost: sequence numbers below the highest seen that never arrived intact.
	lost := uint64(0)
	if good := b.n - b.bad; b.maxSeq > good {
		lost = b.maxSeq - good
	}
	fmt.Printf("udpbulk: received datagrams=%d bytes=%d bad=%d lost=%d seconds=%.3f gbps=%.3f\n",
		b.n, b.bytes, b.bad, lost, el, gbps)
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
