//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
	"tapgro/pcapio"
	"tapgro/vhostuser/vhostusertest"
)

// The operator surfaces of a vhost-user tapgro, driven by a Go front-end (the
// vhostusertest double plays QEMU 7.2 and the guest driver) against the real binary:
// `tapgro ctl status` names the features the guest acked, `tapgro ctl offload` caps the
// TAP's offloads under the running session and `gro=` and `udp-gro=` switch, `tapgro ctl
// pcap tap=… port=…` records on both sides what the guest sent and received (the same
// frames here: nothing merged or cut), and /healthz turns 503 while the guest posts no receive buffers with frames
// waiting in the TAP, and 200 again once it does.
//
//	netns: 198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user socket ══ this test (guest memory, rings)

// ctlVhostJSON is the part of `tapgro ctl --json status` this test reads.
type ctlVhostJSON struct {
	OK     bool `json:"ok"`
	Status struct {
		PortConnected bool   `json:"port_connected"`
		GROActive     bool   `json:"gro_active"`
		TapOffloads   string `json:"tap_offloads"`
		PcapPort      string `json:"pcap_port"`
		Vhost         *struct {
			Acked  []string `json:"acked"`
			HdrLen int      `json:"hdr_len"`
			MTU    int      `json:"guest_mtu"`
		} `json:"vhost"`
	} `json:"status"`
}

// ethFrame is a broadcast frame of IEEE 802's local experimental EtherType (nothing in
// the namespace answers it), n bytes long, its payload numbered by seq.
func ethFrame(src []byte, n int, seq byte) []byte {
	f := make([]byte, n)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x88b5)
	for i := 14; i < n; i++ {
		f[i] = seq + byte(i)
	}
	return f
}

func TestVhostUserOps(t *testing.T) {
	netnstest.RequirePriv(t)
	ns := netnstest.New(t, "vuops")
	dir := t.TempDir()
	sock, ctlSock, pcap := filepath.Join(dir, "vu.sock"), filepath.Join(dir, "ctl"), filepath.Join(dir, "p.pcap")
	pcapTap := filepath.Join(dir, "t.pcap")
	const maddr = "127.0.0.1:9111"
	tg := startTapgro(t, ns, "tapgro", "--tap", "tg0", "--mtu", "1500", "--addr", hostIP4+"/24",
		"--netdev", "vhost-user,path="+sock, "--ctl-socket", ctlSock, "--metrics-addr", maddr, "--health-stall", "2s",
		// Confined, tapgro creates capture files at run time only where it was told.
		"--pcap-dir", dir)
	tg.waitLog(readyRe, 10*time.Second)

	status := func() ctlVhostJSON {
		t.Helper()
		out, err := ctl(t, ns, ctlSock, "--json", "status")
		if err != nil {
			t.Fatalf("tapgro ctl status: %v\n%s", err, out)
		}
		var st ctlVhostJSON
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.Status.Vhost == nil {
			t.Fatalf("status reply %q: %v", out, err)
		}
		return st
	}
	if st := status(); st.Status.PortConnected || len(st.Status.Vhost.Acked) != 0 {
		t.Errorf("before any front-end: connected %v, acked %v", st.Status.PortConnected, st.Status.Vhost.Acked)
	}

	s := vhostusertest.Dial(t, sock, vhostusertest.Options{})
	st := status()
	acked := " " + strings.Join(st.Status.Vhost.Acked, " ") + " "
	for _, f := range []string{"VERSION_1", "MRG_RXBUF", "CSUM", "GUEST_CSUM", "HOST_TSO4", "HOST_TSO6", "GUEST_TSO4", "GUEST_TSO6", "EVENT_IDX", "MTU"} {
		if !strings.Contains(acked, " "+f+" ") {
			t.Errorf("ctl status acked features %q lack %s", acked, f)
		}
	}
	// This kernel (6.18) takes TUN_F_USO4/6, so USO is on: whole for this guest, which
	// acked GUEST_USO4/6 (the double acks everything offered).
	const full = "csum,tso4,tso6,tso_ecn,uso4,uso6"
	if !st.Status.PortConnected || st.Status.Vhost.HdrLen != 12 || st.Status.Vhost.MTU != 1500 ||
		st.Status.TapOffloads != full {
		t.Errorf("status: connected %v, header %d, guest MTU %d, TAP offloads %q; want true, 12, 1500, %s",
			st.Status.PortConnected, st.Status.Vhost.HdrLen, st.Status.Vhost.MTU, st.Status.TapOffloads, full)
	}
	out, _ := ctl(t, ns, ctlSock, "status")
	if !strings.Contains(out, "features acked:") || !strings.Contains(out, "HOST_TSO4") || !strings.Contains(out, "GUEST_USO4") {
		t.Errorf("tapgro ctl status does not name the features:\n%s", out)
	}
	// GRO switches at run time, as on every port (vhostnet's TX workers take it up at
	// their next batch; its own test checks the frames).
	for _, on := range []bool{false, true} {
		req := map[bool]string{false: "gro=off", true: "gro=on"}[on]
		if out, err := ctl(t, ns, ctlSock, req); err != nil {
			t.Errorf("ctl %s: %v\n%s", req, err, out)
		}
		if st := status(); st.Status.GROActive != on {
			t.Errorf("after ctl %s: gro_active %v", req, st.Status.GROActive)
		}
	}
	// The TAP's offloads follow the cap at once (read back from the kernel), and auto
	// gives back what the guest acked.
	for _, c := range []struct{ req, want string }{{"uso=off", "csum,tso4,tso6,tso_ecn"}, {"off", "none"}, {"auto", full}} {
		if out, err := ctl(t, ns, ctlSock, "offload", c.req); err != nil {
			t.Fatalf("ctl offload %s: %v\n%s", c.req, err, out)
		}
		if st := status(); st.Status.TapOffloads != c.want {
			t.Errorf("after ctl offload %s: TAP offloads %q, want %s", c.req, st.Status.TapOffloads, c.want)
		}
		if got := ethtoolOffloads(t, ns, "tg0"); (c.want == "none") == strings.Contains(got, "tso4") {
			t.Errorf("after ctl offload %s: the kernel shows %s", c.req, got)
		}
	}
	if out, err := ctl(t, ns, ctlSock, "udp-gro=off"); err != nil || !strings.Contains(out, "udp-gro off") {
		t.Errorf("ctl udp-gro=off: %v, %q", err, out)
	}

	if out, err := ctl(t, ns, ctlSock, "pcap", "port="+pcap, "tap="+pcapTap); err != nil {
		t.Fatalf("ctl pcap port= tap=: %v\n%s", err, out)
	}
	// Guest → TAP: three frames, one split over descriptors.
	mac := []byte{0x02, 0, 0, 0, 0, 0x02}
	hdr := make([]byte, s.HdrLen())
	tx := s.TX(0)
	var sent [][]byte
	for i, split := range [][]int{nil, {12, 20}, {5, 100, 200}} {
		f := ethFrame(mac, 300+100*i, byte(i))
		sent = append(sent, f)
		tx.SendFrame(append(hdr[:len(hdr):len(hdr)], f...), split, false)
	}
	tx.KickNow()
	if !tx.WaitUsed(3, 10*time.Second) {
		t.Fatalf("tapgro did not complete the 3 TX chains (used idx %d)", tx.UsedIdx())
	}
	tx.Reap()
	// TAP → guest: the host's echo requests to the guest's address (a static neighbour:
	// the double answers nothing, not even ARP). A reservation covers the largest frame
	// the TAP can hand over (65605 bytes with the header), so 64 chains of 4 KiB leave
	// room for about 48 frames before the ring counts as full.
	ns.MustRun(t, "ip", "neigh", "replace", guestIP4, "lladdr", "02:00:00:00:00:02", "dev", "tg0", "nud", "permanent")
	rx := s.RX(0)
	rx.PostRX(64, 4096, 1)
	rx.KickNow()
	ns.Run("ping", "-c", "1", "-W", "1", guestIP4)
	var got []vhostusertest.RXFrame
	for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		rx.WaitCall(100 * time.Millisecond)
		got = append(got, rx.ReapRX(s.HdrLen(), true)...)
	}
	if len(got) == 0 {
		t.Fatal("no frame reached the guest's receive ring")
	}
	if out, err := ctl(t, ns, ctlSock, "pcap", "port=off", "tap=off"); err != nil {
		t.Fatalf("ctl pcap port=off tap=off: %v\n%s", err, out)
	}
	recs := readPcap(t, pcap)
	if len(recs) < 4 {
		t.Fatalf("capture holds %d records, want the 3 frames sent and at least one received", len(recs))
	}
	// The TAP's side saw the same frames (none was merged, coalesced or cut): the three
	// sent, and among what the TAP handed over, the first frame the guest received (the
	// host's own traffic, IPv6 neighbour discovery say, may come between).
	tapRecs := readPcap(t, pcapTap)
	if len(tapRecs) < 4 {
		t.Fatalf("TAP-side capture holds %d records, want at least 4", len(tapRecs))
	}
	for i := range 3 {
		if !bytes.Equal(tapRecs[i], recs[i]) {
			t.Errorf("TAP-side record %d (%d bytes) differs from the port side's (%d bytes)", i, len(tapRecs[i]), len(recs[i]))
		}
	}
	if !slices.ContainsFunc(tapRecs[3:], func(r []byte) bool { return bytes.Equal(r, got[0].Frame) }) {
		t.Errorf("the TAP-side capture lacks the first frame the guest received (%d bytes)", len(got[0].Frame))
	}
	for i, f := range sent {
		if !bytes.Equal(recs[i], f) {
			t.Errorf("capture record %d (%d bytes) is not frame %d sent (%d bytes)", i, len(recs[i]), i, len(f))
		}
	}
	if !bytes.Equal(recs[3], got[0].Frame) {
		t.Errorf("capture record 3 (%d bytes) is not the first frame received (%d bytes)", len(recs[3]), len(got[0].Frame))
	}

	// A guest that posts no more receive buffers while the host sends 100 frames: the
	// chains left are used up, then frames wait in the TAP's queue.
	if code, body := scrapeNS(t, ns, maddr, "/healthz"); code != 200 {
		t.Fatalf("/healthz before the stall: %d %q", code, body)
	}
	ns.Run("ping", "-q", "-c", "100", "-i", "0.01", "-W", "0.1", guestIP4)
	var code int
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = scrapeNS(t, ns, maddr, "/healthz"); code == 503 {
			break
		}
	}
	if code != 503 || !strings.Contains(body, "tap_to_port stalled: frames wait in the TAP and the guest posts no receive buffers") {
		t.Fatalf("/healthz with no receive buffers: %d %q", code, body)
	}
	if m := scrape(t, ns, maddr); m.get(t, `tapgro_stalled{direction="tap_to_port"}`) != 1 {
		t.Errorf("tapgro_stalled{tap_to_port} is not 1 during the stall")
	}
	rx.Reap()
	rx.PostRX(64, 4096, 1)
	rx.KickNow()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		rx.Reap()
		if code, body = scrapeNS(t, ns, maddr, "/healthz"); code == 200 {
			break
		}
	}
	if code != 200 {
		t.Fatalf("/healthz after the guest posted buffers: %d %q", code, body)
	}
	m := scrape(t, ns, maddr)
	if v := m.get(t, `tapgro_rx_stalls_total`); v < 1 {
		t.Errorf("tapgro_rx_stalls_total = %v after a stall", v)
	}
	if v := m.get(t, `tapgro_pcap_frames_total{side="port"}`); v < 4 {
		t.Errorf("tapgro_pcap_frames_total{side=port} = %v", v)
	}
	s.Close()
	tg.stop()
}

// readPcap returns the frames of a capture file tapgro wrote.
func readPcap(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs [][]byte
	for off := pcapio.FileHeaderLen; off+pcapio.RecordHeaderLen <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off+8:]))
		off += pcapio.RecordHeaderLen
		if off+n > len(b) {
			t.Fatalf("%s: truncated record", path)
		}
		recs = append(recs, b[off:off+n])
		off += n
	}
	return recs
}
