package netdev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"tapgro/port"
	"tapgro/port/porttest"
	"tapgro/sockport"
	"testing"
	"time"
)

// recorder turns Events into channels the test can wait on.
type recorder struct {
	connect    chan string
	reject     chan string
	disconnect chan error
	retry      chan error
}

func newRecorder() *recorder {
	return &recorder{
		connect:    make(chan string, 16),
		reject:     make(chan string, 16),
		disconnect: make(chan error, 16),
		retry:      make(chan error, 64),
	}
}

func (r *recorder) events() Events {
	return Events{
		OnConnect:    func(peer string) { r.connect <- peer },
		OnReject:     func(peer, why string) { r.reject <- peer + ": " + why },
		OnDisconnect: func(peer string, err error) { r.disconnect <- err },
		OnRetry: func(addr string, err error, wait time.Duration) {
			select {
			case r.retry <- err:
			default:
			}
		},
	}
}

func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatalf("no %s event", what)
		panic("unreachable")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sockPath(t *testing.T, name string) string {
	p := filepath.Join(t.TempDir(), name)
	if len(p) > sockport.MaxUnixPath {
		t.Skipf("temp dir too deep for a UNIX socket path: %s", p)
	}
	return p
}

// rawFrame writes one length-prefixed frame on a raw stream connection.
func rawFrame(t *testing.T, c net.Conn, f []byte) {
	t.Helper()
	if _, err := c.Write(append(prefixOnly(uint32(len(f))), f...)); err != nil {
		t.Fatal(err)
	}
}

func TestServerOneClient(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			spec := "stream,server=on,addr.type=inet,addr.host=127.0.0.1,addr.port=0"
			network := "tcp"
			if kind == "unix" {
				spec = "stream,server=on,addr.type=unix,addr.path=" + sockPath(t, "s.sock")
				network = "unix"
			}
			sp, err := ParseSpec(spec)
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorder()
			ep, err := Open(sp, rec.events())
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			dialAddr := ep.Addr()
			if kind == "unix" {
				dialAddr = sp.Local.Path
			}
			ctx := testCtx(t)

			c1, err := net.Dial(network, dialAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			p1, err := ep.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			recv(t, rec.connect, "connect")
			f := porttest.Frame(1514, 1)
			rawFrame(t, c1, f)
			porttest.ReadFrames(t, p1, [][]byte{f})

			// A second client is accepted and closed at once, with its identity reported.
			c2, err := net.Dial(network, dialAddr)
			if err != nil {
				t.Fatal(err)
			}
			why := recv(t, rec.reject, "reject")
			if kind == "unix" && !strings.Contains(why, fmt.Sprintf("pid=%d ", os.Getpid())) {
				t.Errorf("reject %q does not name our pid", why)
			}
			if kind == "tcp" && !strings.Contains(why, c2.LocalAddr().String()) {
				t.Errorf("reject %q does not name the client address %s", why, c2.LocalAddr())
			}
			if _, err := c2.Read(make([]byte, 1)); err == nil {
				t.Errorf("rejected client can still read")
			}
			c2.Close()
			if got := ep.Stats().Rejects.Load(); got != 1 {
				t.Errorf("Rejects = %d, want 1", got)
			}

			// The first client leaves; the port reports it; after Close a new client is served.
			c1.Close()
			bufs, sizes := porttest.Buffers(1, port.MaxFrame)
			if _, err := p1.ReadBatch(bufs, sizes); !errors.Is(err, io.EOF) {
				t.Fatalf("ReadBatch after client left: %v, want EOF", err)
			}
			p1.Close()
			if err := recv(t, rec.disconnect, "disconnect"); !errors.Is(err, io.EOF) {
				t.Errorf("OnDisconnect err = %v, want EOF", err)
			}
			c3, err := net.Dial(network, dialAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c3.Close()
			p3, err := ep.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer p3.Close()
			if n, err := p3.WriteBatch([][]byte{f}); n != 1 || err != nil {
				t.Fatal(n, err)
			}
			got := make([]byte, sockport.PrefixLen+len(f))
			if _, err := io.ReadFull(c3, got); err != nil || !bytes.Equal(got[sockport.PrefixLen:], f) {
				t.Fatalf("client 3 read %v", err)
			}
		})
	}
}

func TestServerSocketPath(t *testing.T) {
	porttest.CheckLeaks(t)
	path := sockPath(t, "m.sock")
	sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path)
	old := setUmask(0)
	ep, err := Open(sp, Events{})
	setUmask(old)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want socket 0600", fi.Mode())
	}
	ep.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left %s behind: %v", path, err)
	}
}

func TestServerStalePath(t *testing.T) {
	porttest.CheckLeaks(t)
	path := sockPath(t, "st.sock")
	sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path)

	t.Run("stale socket removed", func(t *testing.T) {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close() // the path stays, nobody answers: a killed process's leftover
		ep, err := Open(sp, Events{})
		if err != nil {
			t.Fatalf("Open over a stale socket: %v", err)
		}
		ep.Close()
	})
	t.Run("live socket kept", func(t *testing.T) {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, err = Open(sp, Events{})
		if !errors.Is(err, ErrAddrInUse) {
			t.Fatalf("Open over a live socket: %v, want ErrAddrInUse", err)
		}
		if c, err := net.Dial("unix", path); err != nil {
			t.Errorf("live socket no longer answers: %v", err)
		} else {
			c.Close()
		}
	})
	t.Run("regular file untouched", func(t *testing.T) {
		if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Open(sp, Events{})
		if err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("Open over a regular file: %v, want a not-a-socket error", err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
			t.Errorf("file changed: %q, %v", b, err)
		}
	})
}

func TestClientRetry(t *testing.T) {
	porttest.CheckLeaks(t)
	path := sockPath(t, "c.sock")
	sp, _ := ParseSpec("stream,server=off,addr.type=unix,addr.path=" + path)
	rec := newRecorder()
	ep, err := Open(sp, rec.events())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx := testCtx(t)

	type result struct {
		p   port.Port
		err error
	}
	res := make(chan result, 1)
	go func() { p, err := ep.Next(ctx); res <- result{p, err} }()
	recv(t, rec.retry, "retry") // nobody listens yet
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := recv(t, res, "Next")
	if r.err != nil {
		t.Fatal(r.err)
	}
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	f := porttest.Frame(9014, 3)
	rawFrame(t, srv, f)
	porttest.ReadFrames(t, r.p, [][]byte{f})
	if ep.Stats().Retries.Load() == 0 {
		t.Errorf("Retries = 0")
	}

	// The server goes away; after the port is closed, Next dials again.
	srv.Close()
	r.p.Close()
	go func() { p, err := ep.Next(ctx); res <- result{p, err} }()
	srv2, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	r = recv(t, res, "Next")
	if r.err != nil {
		t.Fatal(r.err)
	}
	rawFrame(t, srv2, f)
	porttest.ReadFrames(t, r.p, [][]byte{f})
	r.p.Close()
}

func TestNextCancel(t *testing.T) {
	porttest.CheckLeaks(t)
	sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + sockPath(t, "x.sock"))
	ep, err := Open(sp, Events{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ep.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next with a cancelled ctx: %v", err)
	}
	errc := make(chan error)
	go func() { _, err := ep.Next(context.Background()); errc <- err }()
	ep.Close()
	if err := recv(t, errc, "Next"); !errors.Is(err, port.ErrClosed) {
		t.Errorf("Next after Close: %v, want port.ErrClosed", err)
	}

	// A client endpoint dialling nowhere stops on Close too.
	sp, _ = ParseSpec("stream,addr.type=unix,addr.path=" + sockPath(t, "nobody.sock"))
	ep, _ = Open(sp, Events{})
	go func() { _, err := ep.Next(context.Background()); errc <- err }()
	ep.Close()
	if err := recv(t, errc, "Next"); !errors.Is(err, port.ErrClosed) {
		t.Errorf("client Next after Close: %v, want port.ErrClosed", err)
	}
}

func TestDgramEndpoint(t *testing.T) {
	for _, kind := range []string{"udp", "unix"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			// The peer (QEMU's role) is a plain socket.
			var peer net.PacketConn
			var spec, local string
			var err error
			if kind == "udp" {
				peer, err = net.ListenPacket("udp4", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				spec = fmt.Sprintf("socket,udp=%s,localaddr=127.0.0.1:0", peer.LocalAddr())
			} else {
				dir := t.TempDir()
				peer, err = net.ListenPacket("unixgram", filepath.Join(dir, "q.dg"))
				if err != nil {
					t.Fatal(err)
				}
				local = filepath.Join(dir, "g.dg")
				spec = "dgram,local.type=unix,local.path=" + local + ",remote.type=unix,remote.path=" + filepath.Join(dir, "q.dg")
			}
			defer peer.Close()
			sp, err := ParseSpec(spec)
			if err != nil {
				t.Fatal(err)
			}
			ep, err := Open(sp, Events{})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			ctx := testCtx(t)

			var dst net.Addr
			if kind == "udp" {
				dst, _ = net.ResolveUDPAddr("udp4", ep.Addr())
			} else {
				dst = &net.UnixAddr{Net: "unixgram", Name: local}
				if fi, err := os.Lstat(local); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("local path: %v, %v; want mode 0600", fi, err)
				}
			}
			f := porttest.Frame(1514, 4)
			for round := 0; round < 2; round++ { // the second round uses a rebound socket
				p, err := ep.Next(ctx)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if _, err := peer.WriteTo(f, dst); err != nil {
					t.Fatal(err)
				}
				porttest.ReadFrames(t, p, [][]byte{f})
				if n, err := p.WriteBatch([][]byte{f}); n != 1 || err != nil {
					t.Fatal(n, err)
				}
				buf := make([]byte, port.MaxFrame)
				n, _, err := peer.ReadFrom(buf)
				if err != nil || !bytes.Equal(buf[:n], f) {
					t.Fatalf("peer got %d bytes, %v", n, err)
				}
				p.Close()
			}
			ep.Close()
			if kind == "unix" {
				if _, err := os.Lstat(local); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("Close left %s behind", local)
				}
			}
		})
	}
}
