// Package iperfns runs one iperf3 measurement between two network namespaces: a one-off
// server (iperf3 -s -1) in one, a JSON-reporting client (iperf3 -c -J) in the other. It
// is shared by `tapgro demo` and the benchmark tool, so the two quirks of iperf3 that
// decide how it must be driven are handled in one place:
//
//   - The client may start before the server listens. With -J, iperf3 3.12 (Debian 12)
//     then exits 0 and puts "unable to connect to server: Connection refused" in the
//     JSON's error field, so the error field, not the exit status, decides: the client is
//     retried while the server refuses, and any other reported error is a failure.
//   - A one-off server does not always exit after a multi-stream or reverse (-R) test, so
//     it is given a moment after the client finished and then killed, and a run never
//     hangs on it.
package iperfns

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Run starts the server in serverNS bound to dst, runs `iperf3 -c dst -J args...` in
// clientNS and returns the client's JSON report. On failure the error carries iperf3's own
// message and the last lines of the server's output.
func Run(serverNS, clientNS, dst string, args ...string) ([]byte, error) {
	srv := exec.Command("ip", "netns", "exec", serverNS, "iperf3", "-s", "-1", "-B", dst)
	srvOut := &lockedBuffer{}
	srv.Stdout, srv.Stderr = srvOut, srvOut
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start the iperf3 server in %s: %w", serverNS, err)
	}
	srvDone := make(chan struct{})
	go func() { srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone:
		case <-time.After(3 * time.Second):
			srv.Process.Kill()
			<-srvDone
		}
	}()
	var out []byte
	var err error
	var report struct {
		Error string `json:"error"`
	}
	for try := 0; try < 50; try++ {
		out, err = exec.Command("ip", append([]string{"netns", "exec", clientNS, "iperf3", "-c", dst, "-J"}, args...)...).Output()
		report.Error = ""
		if json.Unmarshal(out, &report) == nil && report.Error != "" && err == nil {
			err = fmt.Errorf("iperf3 reported an error")
		}
		if err == nil || !bytes.Contains(out, []byte("refused")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err == nil {
		return out, nil
	}
	srv.Process.Kill()
	<-srvDone // so srvOut is complete
	msg := strings.TrimSpace(string(out))
	if report.Error != "" {
		msg = report.Error // iperf3's own line, not the whole JSON document
	}
	return nil, fmt.Errorf("iperf3 client in %s: %v: %s\n  iperf3 server in %s said:\n%s",
		clientNS, err, msg, serverNS, lastLines(srvOut.String(), 5, "    "))
}

// ReceivedBitsPerSecond is the receiving side's throughput in a TCP report.
func ReceivedBitsPerSecond(report []byte) (float64, error) {
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(report, &r); err != nil {
		return 0, fmt.Errorf("iperf3 output: %w", err)
	}
	if r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 reported no throughput")
	}
	return r.End.SumReceived.BitsPerSecond, nil
}

// lastLines is the last n lines of s, each indented, or "(empty)".
func lastLines(s string, n int, indent string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return indent + "(empty)"
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return indent + strings.Join(lines, "\n"+indent)
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
