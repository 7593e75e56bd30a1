package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"time"
)

// UDP request/response: 1-byte datagrams, one outstanding at a time (netperf UDP_RR's
// pattern). A datagram is the case a GRO engine that holds what it cannot yet merge
// gets wrong first: nothing follows it, so it waits for the engine's timer, at every
// coalescing hop of the round trip.

// udpRRPort is the echo server's port.
const udpRRPort = 7008

// udpRR runs the echo server in d.server and rrRounds round trips from d.client to it,
// and returns the median round trip in µs.
func (b *bench) udpRR(d direction) (float64, error) {
	srv := exec.Command("ip", "netns", "exec", d.server, b.self, "-udp-echo", fmt.Sprintf(":%d", udpRRPort))
	ready, err := srv.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	// A datagram sent before the server is bound comes back as ICMP port unreachable,
	// which fails the client's connected socket: wait for the server's line.
	if line, err := bufio.NewReader(ready).ReadString('\n'); err != nil || line != udpEchoReady+"\n" {
		return 0, fmt.Errorf("UDP echo server: %q, %v", line, err)
	}
	out, err := exec.Command("ip", "netns", "exec", d.client, b.self, "-udp-rr-client",
		fmt.Sprintf("%s:%d", d.dst, udpRRPort), "-rr-rounds", strconv.Itoa(rrRounds)).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("UDP ping-pong client: %v: %s", err, out)
	}
	rtts, err := parseRTTs("UDP ping-pong client", out)
	if err != nil {
		return 0, err
	}
	if len(rtts) == 0 {
		return 0, errors.New("UDP ping-pong client printed nothing")
	}
	sort.Float64s(rtts)
	return rtts[len(rtts)/2], nil
}

// udpEchoReady is what udpEcho prints once it is bound.
const udpEchoReady = "ready"

// udpEcho is benchtool -udp-echo ADDR: it sends every datagram back to its sender.
func udpEcho(addr string) error {
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	fmt.Println(udpEchoReady)
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(buf[:n], from); err != nil {
			return err
		}
	}
}

// udpRRClient is benchtool -udp-rr-client ADDR: rrWarm unmeasured round trips, a
// datagram sent again after a silent second (the path may still be learning its
// neighbours), then n measured ones, printed in µs. A measured datagram that gets no
// answer within a second fails the run: there is no loss to expect on this path.
func udpRRClient(addr string, n int) error {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	b := []byte{'x'}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	start := time.Now()
	for i := 0; i < rrWarm+n; i++ {
		t0 := time.Now()
		for {
			if _, err := conn.Write(b); err != nil {
				return err
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			_, err := conn.Read(b)
			if err == nil {
				break
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) || i >= rrWarm || time.Since(start) > 30*time.Second {
				return fmt.Errorf("round trip %d: %w", i, err)
			}
		}
		if i >= rrWarm {
			fmt.Fprintf(out, "%.1f ", float64(time.Since(t0).Nanoseconds())/1e3)
		}
	}
	return nil
}
