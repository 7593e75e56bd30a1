package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"tapgro/netdev"
	"tapgro/ops"
)

// `tapgro ctl`, the control socket's client, and where the daemon creates the socket.
// The protocol and the server are in package ops.

// ctlDefaultDir holds the default control sockets, one per TAP name.
const ctlDefaultDir = "/run/tapgro"

// defaultCtlSocket is where the control socket of the TAP named tap lives.
func defaultCtlSocket(tap string) string { return filepath.Join(ctlDefaultDir, tap+".ctl") }

// startCtl serves the control socket o asks for until the returned func is called. An
// explicit --ctl-socket that cannot be created is an error; the default path only
// warns, so a second tapgro for a TAP of the same name in another network namespace
// (the path is per host, the name per namespace) still starts.
func startCtl(o *options, s *ops.CtlServer, log *logrus.Logger) (func(), error) {
	path := o.ctlSocket
	if path == "" {
		return func() {}, nil
	}
	opt := netdev.Options{SocketMode: 0o600, AllowUnsafeDir: o.allowUnsafeDir}
	if o.user != nil {
		// 0600 keeps meaning "root and the user tapgro runs as".
		opt.SocketUID, opt.SocketGID = o.user.uid, o.user.gid
	}
	ln, remove, err := listenCtl(path, opt)
	if err != nil {
		if o.ctlSocketDefault {
			log.WithError(err).WithField("path", path).Warn("no control socket: cannot create the default one; give --ctl-socket PATH (or --ctl-socket \"\" to silence this)")
			return func() {}, nil
		}
		return nil, fmt.Errorf("--ctl-socket: %w", err)
	}
	done := make(chan struct{})
	go func() { s.Serve(ln); close(done) }()
	log.WithField("path", path).Info("control socket ready (tapgro ctl)")
	return func() {
		ln.Close()
		<-done
		remove()
	}, nil
}

// listenCtl creates path's directory if it is missing (0700: the socket is root's
// business) and listens on path.
func listenCtl(path string, opt netdev.Options) (*net.UnixListener, func(), error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
	}
	return netdev.ListenUnix(path, opt)
}

const ctlUsageText = `Usage:
  tapgro ctl [--socket PATH | --tap NAME] [--json] REQUEST

Requests:
  status                         port, negotiated offloads, GRO, key counters
  offload auto|off|LIST          set the TAP's offloads (LIST: csum,tso4,tso6,tso_ecn,uso)
  offload tso4=off csum=on ...   change single offloads ("offload" may be left out)
  gro=on|off  udp-gro=on|off     port->TAP coalescing
  pcap tap=FILE|off port=FILE|off
                                 capture each side into a pcap file (absolute path), or stop
Changes apply at once, without dropping the port connection.

Flags:
`

// runCtl is `tapgro ctl`: it sends one request to a running tapgro and prints the reply.
func runCtl(args []string, stdout, stderr io.Writer) int {
	fset := newCtlFlags(stderr)
	socket := fset.String("socket", "", "control socket path (default "+ctlDefaultDir+"/TAP.ctl)")
	tap := fset.String("tap", "", "the TAP tapgro serves: use its default control socket")
	raw := fset.Bool("json", false, "print the JSON reply as it came")
	timeout := fset.Duration("timeout", ops.Timeout, "give up after this long")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		return 2
	}
	if fset.NArg() == 0 {
		fmt.Fprintln(stderr, "tapgro ctl: no request")
		fset.Usage()
		return 2
	}
	path, err := ctlPath(*socket, *tap)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro ctl:", err)
		return 2
	}
	req := strings.Join(fset.Args(), " ")
	body, err := ctlCall(path, req, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro ctl:", err)
		return 1
	}
	var resp ops.Response
	if err := json.Unmarshal(body, &resp); err != nil {
		fmt.Fprintf(stderr, "tapgro ctl: %s answered something that is not a reply: %v\n", path, err)
		return 1
	}
	if *raw {
		stdout.Write(body)
	}
	if !resp.OK {
		fmt.Fprintln(stderr, "tapgro ctl:", resp.Error)
		return 1
	}
	if *raw {
		return 0
	}
	for _, a := range resp.Applied {
		fmt.Fprintln(stdout, a)
	}
	switch {
	case resp.Status == nil:
	case len(resp.Applied) == 0:
		ops.WriteStatus(stdout, resp.Status)
	default:
		fmt.Fprintln(stdout, "negotiated: "+resp.Status.Negotiated)
	}
	return 0
}

func newCtlFlags(stderr io.Writer) *flag.FlagSet {
	fset := flag.NewFlagSet("tapgro ctl", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {
		fmt.Fprint(stderr, ctlUsageText)
		fset.PrintDefaults()
	}
	return fset
}

// ctlPath picks the socket: --socket, --tap's default, or the only socket in the
// default directory.
func ctlPath(socket, tap string) (string, error) {
	switch {
	case socket != "" && tap != "":
		return "", errors.New("give --socket or --tap, not both")
	case socket != "":
		return socket, nil
	case tap != "":
		return defaultCtlSocket(tap), nil
	}
	m, _ := filepath.Glob(filepath.Join(ctlDefaultDir, "*.ctl"))
	switch len(m) {
	case 1:
		return m[0], nil
	case 0:
		return "", fmt.Errorf("no control socket in %s; give --socket PATH or --tap NAME", ctlDefaultDir)
	}
	return "", fmt.Errorf("several control sockets in %s (%s); give --tap NAME or --socket PATH", ctlDefaultDir, strings.Join(m, ", "))
}

// ctlCall sends req and returns the raw reply.
func ctlCall(path, req string, timeout time.Duration) ([]byte, error) {
	if len(req)+1 > ops.MaxRequest {
		return nil, fmt.Errorf("request longer than %d bytes", ops.MaxRequest)
	}
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		if errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%w (the control socket is for root and tapgro's own user)", err)
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (is tapgro running with this control socket?)", err)
		}
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, req+"\n"); err != nil {
		return nil, fmt.Errorf("send to %s: %w", path, err)
	}
	c.(*net.UnixConn).CloseWrite()
	body, err := io.ReadAll(io.LimitReader(c, ops.MaxResponse))
	if err != nil {
		return nil, fmt.Errorf("reply from %s: %w", path, err)
	}
	if len(body) == 0 {
		return nil, fmt.Errorf("%s closed the connection without a reply", path)
	}
	return body, nil
}
