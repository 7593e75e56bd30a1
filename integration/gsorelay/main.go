// Package main is the gsorelay command, the benchmark's reference for vnet-hdr=on: one
// process relaying between two TAPs that both carry a vnet header, so 64 KB GSO frames
// pass whole with no socket in between. Each frame costs the two copies any TAP relay
// pays (the TAP read and the TAP write), which is what two tapgro joined by vnet-hdr=on
// with shared-memory rings also pay, plus a second process and a stream. It is part of
// the test tree, not of tapgro.
//
// With -split each direction reads on one thread and writes on another, handing frames
// over a channel from a ring of buffers: the structure of any relay with a hop between
// reading one TAP and writing the other (two tapgro processes have one), without a
// socket or a second process. The gap between the two modes is what that hop costs.
//
// It creates the TAPs in its own namespace, moves one into each given namespace and
// addresses them there; they vanish when it exits.
//
// Usage: gsorelay -a NS -a-addr CIDR -b NS -b-addr CIDR [-mtu N] [-split]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

func main() {
	nsA := flag.String("a", "", "namespace for the first TAP")
	addrA := flag.String("a-addr", "", "address/prefix of the first TAP")
	nsB := flag.String("b", "", "namespace for the second TAP")
	addrB := flag.String("b-addr", "", "address/prefix of the second TAP")
	mtu := flag.Int("mtu", 1500, "MTU of both TAPs")
	flag.BoolVar(&split, "split", false, "read and write each direction on separate threads")
	flag.Parse()
	if err := run(*nsA, *addrA, *nsB, *addrB, *mtu); err != nil {
		fmt.Fprintln(os.Stderr, "gsorelay:", err)
		os.Exit(1)
	}
}

// open creates a TAP with a 10-byte vnet header that may hand us checksum-less and TSO
// frames, as tapgro's TAP does with --offload auto.
func open(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return -1, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return -1, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6|unix.TUN_F_TSO_ECN); err != nil {
		return -1, fmt.Errorf("TUNSETOFFLOAD %s: %w", name, err)
	}
	return fd, nil
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %v: %v: %s", args, err, out)
	}
	return nil
}

func run(nsA, addrA, nsB, addrB string, mtu int) error {
	tag := strconv.Itoa(os.Getpid())
	type side struct {
		fd             int
		ns, addr, name string
	}
	sides := []*side{{ns: nsA, addr: addrA, name: "gra" + tag}, {ns: nsB, addr: addrB, name: "grb" + tag}}
	for _, s := range sides {
		fd, err := open(s.name)
		if err != nil {
			return err
		}
		s.fd = fd
		for _, args := range [][]string{
			{"link", "set", s.name, "netns", s.ns},
			{"-n", s.ns, "link", "set", s.name, "mtu", strconv.Itoa(mtu)},
			{"-n", s.ns, "addr", "add", s.addr, "dev", s.name},
			{"-n", s.ns, "link", "set", s.name, "up"},
		} {
			if err := ip(args...); err != nil {
				return err
			}
		}
	}
	errc := make(chan error, 2)
	go func() { errc <- relay(sides[0].fd, sides[1].fd) }()
	go func() { errc <- relay(sides[1].fd, sides[0].fd) }()
	return <-errc
}

var split bool

const frameCap = 10 + 65593 // the TAP's vnet header and its largest frame

// relay moves frames, header and all, one read and one write each, on a blocking fd: the
// simplest loop there is, so the row measures the TAPs, not the relay.
func relay(from, to int) error {
	if split {
		return relaySplit(from, to)
	}
	buf := make([]byte, frameCap)
	for {
		n, err := unix.Read(from, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if _, err := unix.Write(to, buf[:n]); err != nil && err != unix.EINTR && err != unix.EIO {
			return fmt.Errorf("write: %w", err)
		}
	}
}

// relaySplit is relay with the write on another thread: frames go from the reader to the
// writer over a channel, in buffers of a 128-entry ring the writer hands back.
func relaySplit(from, to int) error {
	const n = 128
	type frame struct{ buf, pkt []byte }
	full, free := make(chan frame, n), make(chan []byte, n)
	for i := 0; i < n; i++ {
		free <- make([]byte, frameCap)
	}
	go func() {
		runtime.LockOSThread()
		for f := range full {
			unix.Write(to, f.pkt)
			free <- f.buf
		}
	}()
	runtime.LockOSThread()
	for {
		buf := <-free
		m, err := unix.Read(from, buf)
		if err == unix.EINTR {
			free <- buf
			continue
		}
		if err != nil {
			close(full)
			return fmt.Errorf("read: %w", err)
		}
		full <- frame{buf, buf[:m]}
	}
}
