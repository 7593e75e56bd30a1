package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// Switching offloads and GRO at run time (what `tapgro ctl` does) while frames flow both
// ways loses nothing and keeps the port connection: every byte sent from the port
// reaches the TAP in order, every TSO frame from the TAP reaches the port as segments,
// and the port→TAP pipeline is still running when the sender stops.
func TestTogglesMidStream(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	in := negInput{TapProbed: oCSUM | oTSO4 | oTSO6 | oECN | oUSO, TapHdrLen: 10, TapWrite: b.cfg.tapAccepts,
		Choice: vnethdr.Choice{Auto: true}, Port: port.Caps{State: "stream(plain)"}, GRO: true, UDPGRO: true}
	b.initNegotiation(in, negotiate(in), nil)
	b.cfg.timerFlush = true // aggregates held across reads: a toggle has something to flush
	b.cfg.rscInterval = 200 * time.Microsecond
	near, far := sockporttest.StreamPair(t)
	b.port.Store(newPortRef(near))
	p2tDone := make(chan error, 1)
	go func() { p2tDone <- b.runPortToTap(near) }()
	t2pDone := make(chan error, 1)
	go func() { t2pDone <- b.runTapToPort() }()

	// The port side reads what the TAP→port pipeline delivers.
	const tsoFrames, tsoPayload = 40, 30000
	received := make(chan int, 1)
	go func() {
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, port.MaxFrame)
		}
		sizes := make([]int, 64)
		total := 0
		for total < tsoFrames*tsoPayload {
			n, err := far.ReadBatch(bufs, sizes)
			if err != nil {
				break
			}
			for i := 0; i < n; i++ {
				lay, err := vnethdr.ParseLayout(bufs[i][:sizes[i]])
				if err != nil {
					break
				}
				total += lay.PayloadLen()
			}
		}
		received <- total
	}()

	all := oCSUM | oTSO4 | oTSO6 | oECN | oUSO
	toggles := []func() error{
		func() error { b.SetGRO(false); return nil },
		func() error { _, err := b.SetTapOffloads(all &^ oTSO4); return err },
		func() error { b.SetUDPGRO(false); return nil },
		func() error { b.SetGRO(true); return nil },
		func() error { _, err := b.SetTapOffloads(0); return err },
		func() error { b.SetGRO(false); b.SetUDPGRO(true); return nil },
		func() error { _, err := b.SetTapOffloadChoice(vnethdr.Choice{Auto: true}); return err },
		func() error { b.SetGRO(true); return nil },
	}
	const batches, perBatch, mss = 64, 16, 1000
	stream := make([]byte, batches*perBatch*mss)
	for i := range stream {
		stream[i] = byte(i*131 + i>>11)
	}
	seq := uint32(1)
	for i := 0; i < batches; i++ {
		var segs [][]byte
		for j := 0; j < perBatch; j++ {
			off := int(seq - 1)
			segs = append(segs, tcp4(seq, uint16(i*perBatch+j), stream[off:off+mss]))
			seq += mss
		}
		if _, err := far.WriteBatch(segs); err != nil {
			t.Fatal(err)
		}
		if i < tsoFrames {
			tap.Inject(gsoTCP4(10, pattern(tsoPayload), 1448))
		}
		if err := toggles[i%len(toggles)](); err != nil {
			t.Fatalf("toggle %d: %v", i%len(toggles), err)
		}
	}

	// Everything sent from the port reaches the TAP, in order.
	var got []byte
	gso, plain := 0, 0
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(stream) && time.Now().Before(deadline) {
		got, gso, plain = tapPayload(t, tap.Written())
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-p2tDone:
		t.Fatalf("the port→TAP pipeline ended during the toggles: %v", err)
	default:
	}
	if !bytes.Equal(got, stream) {
		t.Fatalf("the TAP got %d bytes (%d GSO packets, %d plain); want the %d-byte stream intact", len(got), gso, plain, len(stream))
	}
	t.Logf("port→TAP: %d GSO packets and %d plain segments", gso, plain)
	if n := <-received; n != tsoFrames*tsoPayload {
		t.Fatalf("the port got %d payload bytes from the TAP, want %d", n, tsoFrames*tsoPayload)
	}
	far.Close()
	if err := <-p2tDone; !errors.Is(err, port.ErrClosed) {
		t.Errorf("runPortToTap ended with %v", err)
	}
	tap.Close()
	<-t2pDone
	if d := b.t2p.Drops[DropMalformed].Load() + b.p2t.Drops[DropMalformed].Load() + b.p2t.Drops[DropTapError].Load(); d != 0 {
		t.Errorf("%d frames dropped", d)
	}
}

// tapPayload is the TCP payload of everything written to the TAP, in write order; it
// checks that sequence numbers follow on.
func tapPayload(t *testing.T, pkts [][]byte) (payload []byte, gso, plain int) {
	next := uint32(1)
	for _, p := range pkts {
		var h vnethdr.Hdr
		if err := h.Decode(p, 10); err != nil {
			t.Fatal(err)
		}
		if h.IsGSO() {
			gso++
		} else {
			plain++
		}
		f := p[10:]
		lay, err := vnethdr.ParseLayout(f)
		if err != nil {
			t.Fatal(err)
		}
		if s := binary.BigEndian.Uint32(f[lay.L4Off+4:]); s != next {
			t.Fatalf("packet %d starts at seq %d, want %d", gso+plain, s, next)
		}
		payload = append(payload, f[lay.PayloadOff:lay.End]...)
		next += uint32(lay.PayloadLen())
	}
	return payload, gso, plain
}
