//go:build linux

package vhostnet

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/coalescer"
	"tapgro/coalescer/grotest"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/vnethdr"
)

// TestGROMatrix runs the GRO suite (package grotest, the same cases coalescer's
// TestMatrix holds the engine to) through the vhost-user port: each case's frames
// are put on the guest's TX ring in one batch, GRO on, and what reaches the TAP —
// read back from a packet socket with PACKET_VNET_HDR, so GSO packets come with
// their header — must be exactly the case's packets: passed-through frames
// untouched, GSO headers exact, re-segmentation giving back the input, in order,
// with the same reason counters.
//
// A case runs if the port configures the engine as the case asks: the port never
// coalesces UDP (QEMU 7.2 passes no USO bits), always merges across CWR (GSO_ECN is
// always accepted on write, gro.go), and has no segment cap setting; cases that need
// otherwise are the engine's alone. Frames shorter than an Ethernet header never reach
// the engine here: the port drops them first (DropTXRunt), as the kernel would
// refuse them (drivers/net/tun.c tun_get_user: len < ETH_HLEN is EINVAL).
func TestGROMatrix(t *testing.T) {
	ran := 0
	for _, tc := range grotest.Matrix() {
		in := tc.Frames()
		if why := portSkips(tc.Engine, in); why != "" {
			continue
		}
		ran++
		t.Run(tc.Name, func(t *testing.T) { runMatrixCase(t, tc, in) })
	}
	t.Logf("%d of %d cases run over the port", ran, len(grotest.Matrix()))
	if ran < 50 {
		t.Errorf("only %d cases ran over the port", ran)
	}
}

// portSkips says why a case cannot run over the port ("" if it can).
func portSkips(e grotest.Engine, in [][]byte) string {
	switch {
	case e.UDP:
		return "UDP coalescing"
	case e.DisableTCP:
		return "TCP coalescing off"
	case e.MaxSegments != 0:
		return "a segment cap"
	}
	if !e.ECN {
		for _, f := range in {
			if l, err := vnethdr.ParseLayout(f); err == nil && l.L4Proto == grotest.ProtoTCP && f[l.L4Off+13]&grotest.TCPCWR != 0 {
				return "CWR without ECN merging"
			}
		}
	}
	return ""
}

func runMatrixCase(t *testing.T, tc grotest.Case, in [][]byte) {
	// Timer mode with a long interval: a case longer than one TX batch (txBudget) is
	// still coalesced as one run, as the engine sees it in TestMatrix; the batch that
	// empties the ring flushes everything (gro.go endBatch).
	e := newKernelEnv(t, vhostusertest.Options{}, Config{GRO: true, MaxFlows: tc.Engine.MaxFlows, TimerFlush: true, RSCInterval: time.Second})
	ps := e.vnetSocket()
	hl := e.s.HdrLen()
	tx := e.s.TX(0)
	if 2*len(in) > tx.Free() {
		t.Fatalf("%d frames do not fit the ring (%d descriptors free)", len(in), tx.Free())
	}
	// Which groups the port must deliver: all but frames it drops before the engine.
	var groups [][]int
	dropped := 0
	for _, g := range tc.Groups {
		if len(g) == 1 && len(in[g[0]]) < 14 {
			dropped++
			continue
		}
		groups = append(groups, g)
	}
	// One avail->idx update for the whole case, as a driver publishes a batch. Published
	// frame by frame, the case could be cut: the worker needs no kick to start (Wait
	// re-reads avail->idx before it sleeps), so one still on its way to sleep can take
	// the first frames, find the ring empty and flush what it holds (gro.go endBatch).
	heads := make([]uint16, 0, len(in))
	for _, f := range in {
		data := make([]byte, hl+len(f)) // a zero header: the guest asks for nothing
		copy(data[hl:], f)
		heads = append(heads, tx.PrepareFrame(data, []int{hl}, false))
	}
	tx.Publish(heads...)
	tx.KickNow()
	e.waitTXDone() // the batch ended with the ring empty: everything held was flushed
	marker := testFrame(e.mac, gMAC, 60, 0, 1)
	e.send(vnethdr.Hdr{}, marker, []int{hl}, false)

	var out []grotest.Out
	buf := make([]byte, vnethdr.Len+4+MaxFrame)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no marker after %d packets (stats %v)", len(out), e.stats())
		}
		o, err := recvVnet(ps, buf)
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Frame) >= 14 && binary.BigEndian.Uint16(o.Frame[12:]) == etherTest {
			break
		}
		if o.Hdr.IsGSO() {
			// virtio_net_hdr_from_skb reports hdr_len as the skb's linear length, a
			// fact of tun's allocation, not of the packet; the rest is the packet's.
			if want, ok := grotest.GSOHeader(t, o.Frame); ok {
				o.Hdr.HdrLen = want.HdrLen
			}
		}
		out = append(out, o)
	}
	grotest.CheckGroups(t, in, out, groups)

	st := &e.n.Stats().GRO
	// The marker is one more segment and packet, and a not_tcp_udp.
	if got, want := st.Segments.Load()-1, uint64(len(in)-dropped); got != want {
		t.Errorf("Segments = %d, want %d", got, want)
	}
	if got, want := st.Packets.Load()-1, uint64(len(groups)); got != want {
		t.Errorf("Packets = %d, want %d", got, want)
	}
	for name, n := range tc.Counts {
		r := reasonNamed(t, name)
		got := st.Reason(r).Load()
		if r == coalescer.ReasonNotTCPUDP {
			got--
		}
		if r == coalescer.ReasonMalformed {
			got += uint64(dropped) // counted as port drops instead
		}
		if got != uint64(n) {
			t.Errorf("%s = %d, want %d", name, got, n)
		}
	}
	if d := e.n.Stats().Drops[DropTXRunt].Load(); d != uint64(dropped) {
		t.Errorf("malformed drops %d, want %d", d, dropped)
	}
}

func reasonNamed(t *testing.T, name string) coalescer.Reason {
	for _, r := range append(coalescer.Reasons(), coalescer.ReasonMerged, coalescer.ReasonStarted) {
		if r.String() == name {
			return r
		}
	}
	t.Fatalf("no reason %q", name)
	return 0
}

// vnetSocket is a second packet socket on the TAP, with PACKET_VNET_HDR (each frame
// comes behind the virtio_net_hdr the kernel derives from its skb: net/packet/
// af_packet.c packet_rcv_vnet) and PACKET_AUXDATA (the VLAN tag the receive path moved
// out of the frame into the skb, __netif_receive_skb_core → skb_vlan_untag).
func (e *env) vnetSocket() int {
	t := e.t
	t.Helper()
	var fd int
	if err := e.ns.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			return err
		}
		tv := unix.Timeval{Usec: 200000}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: e.ifx})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// recvVnet reads the next frame that arrived from the TAP (not the kernel's own
// output), its VLAN tag put back where the guest had it.
func recvVnet(fd int, buf []byte) (grotest.Out, error) {
	oob := make([]byte, 256)
	for {
		n, oobn, _, from, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			return grotest.Out{}, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		var o grotest.Out
		o.Hdr.Decode(buf[:n], vnethdr.Len)
		frame := buf[vnethdr.Len:n]
		if tci, tpid, ok := auxVLAN(oob[:oobn]); ok && len(frame) >= 12 {
			tagged := make([]byte, 0, len(frame)+4)
			tagged = append(tagged, frame[:12]...)
			tagged = binary.BigEndian.AppendUint16(tagged, tpid)
			tagged = binary.BigEndian.AppendUint16(tagged, tci)
			o.Frame = append(tagged, frame[12:]...)
			if o.Hdr.Flags&vnethdr.FlagNeedsCsum != 0 {
				// af_packet passes vlan_hlen 0 to virtio_net_hdr_from_skb: csum_start
				// counts from the untagged frame.
				o.Hdr.CsumStart += 4
			}
		} else {
			o.Frame = append([]byte(nil), frame...)
		}
		return o, nil
	}
}

// auxVLAN finds the tpacket_auxdata control message and its VLAN tag, if valid.
func auxVLAN(oob []byte) (tci, tpid uint16, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, 0, false
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_PACKET || m.Header.Type != unix.PACKET_AUXDATA || len(m.Data) < int(unsafe.Sizeof(unix.TpacketAuxdata{})) {
			continue
		}
		a := (*unix.TpacketAuxdata)(unsafe.Pointer(&m.Data[0]))
		if a.Status&unix.TP_STATUS_VLAN_VALID == 0 {
			return 0, 0, false
		}
		tpid = 0x8100
		if a.Status&unix.TP_STATUS_VLAN_TPID_VALID != 0 {
			tpid = a.Vlan_tpid
		}
		return a.Vlan_tci, tpid, true
	}
	return 0, 0, false
}
