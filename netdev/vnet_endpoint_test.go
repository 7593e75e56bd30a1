package netdev

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"tapgro/port"
	"tapgro/port/porttest"
	"tapgro/sockport"
	"testing"
	"time"
)

// End to end through Endpoints: a vnet-hdr=on server and client find each other; a
// plain client is turned away with OnHelloFail while the server keeps serving.
func TestVnetEndpoint(t *testing.T) {
	porttest.CheckLeaks(t)
	path := filepath.Join(t.TempDir(), "s")
	fails := make(chan error, 4)
	srvSpec, err := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path + ",vnet-hdr=on")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Open(srvSpec, Events{OnHelloFail: func(_ string, err error) { fails <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A plain peer first: rejected, not fatal.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := sockport.NewStreamPort(c, nil)
	plain.WriteBatch([][]byte{porttest.Frame(60, 1)})
	got := make(chan port.Port, 1)
	go func() {
		p, err := srv.Next(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	select {
	case err := <-fails:
		if !errors.Is(err, sockport.ErrNotVnetPeer) {
			t.Fatalf("OnHelloFail err = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no OnHelloFail for a plain peer")
	}
	plain.Close()

	cliSpec, err := ParseSpec("stream,server=off,addr.type=unix,addr.path=" + path + ",vnet-hdr=on")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := Open(cliSpec, Events{})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cp, err := cli.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sp := <-got
	if sp == nil {
		t.Fatal("server handed out no port")
	}
	if cp.VnetHdrLen() != sockport.VnetStreamHdrLen || sp.VnetHdrLen() != sockport.VnetStreamHdrLen || sp.Accepts() != sockport.VnetStreamAccepts {
		t.Fatalf("ports: client hdr %d, server hdr %d accepts %s", cp.VnetHdrLen(), sp.VnetHdrLen(), sp.Accepts())
	}
	rec := make([]byte, sockport.VnetStreamHdrLen+100)
	copy(rec[sockport.VnetStreamHdrLen:], porttest.Frame(100, 7))
	if _, err := cp.WriteBatch([][]byte{rec}); err != nil {
		t.Fatal(err)
	}
	readFramesSized(t, sp, [][]byte{rec}, port.MaxFrame+sockport.VnetStreamHdrLen)
	if n := srv.(*server).vnet.HelloFailures.Load(); n != 1 {
		t.Errorf("HelloFailures = %d, want 1", n)
	}
	cp.Close()
	sp.Close()
}

func readFramesSized(t testing.TB, p port.Port, want [][]byte, size int) {
	t.Helper()
	bufs, sizes := porttest.Buffers(8, size)
	got := 0
	for got < len(want) {
		n, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
				t.Fatalf("frame %d differs", got)
			}
			got++
		}
	}
}
