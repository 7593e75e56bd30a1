package datapath

import (
	"testing"
	"time"

	"tapgro/port"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

func TestRenegotiateOnConnectAndToggles(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	in := negInput{TapProbed: oCSUM | oTSO4 | oTSO6 | oECN | oUSO, TapHdrLen: 10, TapWrite: b.cfg.tapAccepts,
		Choice: vnethdr.Choice{Auto: true}, Port: port.Caps{State: "stream(plain)"}, GRO: true, UDPGRO: true}
	n0 := negotiate(in)
	var lines []string
	b.initNegotiation(in, n0, func(n *Negotiation) { lines = append(lines, n.String()) })

	// A vnet-hdr=on peer connects: the steps change, the TAP mask need not.
	near, _ := sockporttest.VnetPair(t, false)
	n, err := b.portConnected(near)
	if err != nil {
		t.Fatal(err)
	}
	if n.T2P.String() != "passthrough+hdr_convert" || n.Port.HdrLen != 12 {
		t.Fatalf("after a vnet peer connected: %s", n)
	}
	if tap.Sets() != 0 {
		t.Errorf("TUNSETOFFLOAD issued %d times for an unchanged mask", tap.Sets())
	}

	// The operator narrows the TAP's offloads at run time.
	set, err := b.SetTapOffloads(oCSUM)
	if err != nil || set != oCSUM || tap.Offloads() != oCSUM {
		t.Fatalf("SetTapOffloads(csum) = %s, %v; TAP mask %s", set, err, tap.Offloads())
	}
	if _, err := b.SetTapOffloads(oTSO4); err == nil {
		t.Error("SetTapOffloads(tso4) without csum must fail")
	}
	// Back to auto.
	if set, err := b.SetTapOffloadChoice(vnethdr.Choice{Auto: true}); err != nil || set != oCSUM|oTSO4|oTSO6|oECN|oUSO {
		t.Fatalf("back to auto: %s, %v", set, err)
	}

	// GRO off at run time: the engine's settings follow, the negotiation says so.
	if n := b.SetGRO(false); n.P2T&StepGRO != 0 {
		t.Errorf("GRO still negotiated after SetGRO(false): %s", n)
	}
	if !b.coalescerConfig().DisableTCP {
		t.Error("coalescer config still coalesces TCP")
	}
	b.SetGRO(true)
	if b.SetUDPGRO(false).P2T&StepUDPGRO != 0 || b.coalescerConfig().UDP {
		t.Error("UDP GRO still on after SetUDPGRO(false)")
	}
	if len(lines) < 6 {
		t.Errorf("expected a negotiated line per change, got %d", len(lines))
	}
}

// Switching GRO off between batches, with the port connected, loses nothing: the held
// aggregate is flushed first and later segments pass one by one.
func TestSetGROMidStream(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	b.cfg.timerFlush = true // hold aggregates across reads, so a toggle has something to flush
	b.cfg.rscInterval = time.Hour
	near, far := sockporttest.StreamPair(t)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()
	seq, id := uint32(1), uint16(1)
	send := func(n int) {
		var segs [][]byte
		for i := 0; i < n; i++ {
			segs = append(segs, tcp4(seq, id, pattern(1000)))
			seq += 1000
			id++
		}
		if _, err := far.WriteBatch(segs); err != nil {
			t.Fatal(err)
		}
	}
	send(5)
	deadline := time.Now().Add(5 * time.Second)
	for b.p2t.Reads.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.SetGRO(false)
	send(3) // the batch boundary applies the switch: flush the 5, then pass these alone
	waitWritten(t, tap, 4)
	far.Close()
	<-done
	out := tap.Written()
	var total int
	for _, o := range out {
		total += len(o) - 10 - 54
	}
	if total != 8000 {
		t.Fatalf("payload %d bytes reached the TAP, want 8000", total)
	}
	if len(out) != 4 {
		t.Fatalf("%d packets, want 4 (one aggregate of 5, then 3 single segments)", len(out))
	}
}
