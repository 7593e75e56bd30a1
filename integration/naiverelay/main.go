// Package main is the naiverelay command, the benchmark's floor: what a bridge between a TAP and a QEMU
// stream socket costs when it does nothing clever. Its TAP has no vnet header (so no
// offloads: the kernel segments and checksums before the TAP), and it moves one frame
// per read and one frame per write in each direction, with QEMU's framing
// ([4-byte big-endian length][frame]). It is part of the test tree, not of tapgro.
//
// Usage: naiverelay -tap NAME -addr CIDR [-mtu N] (-listen PATH | -connect PATH)
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	tap := flag.String("tap", "", "TAP to create")
	addr := flag.String("addr", "", "address/prefix for the TAP")
	mtu := flag.Int("mtu", 1500, "TAP MTU")
	listen := flag.String("listen", "", "UNIX stream socket to listen on")
	connect := flag.String("connect", "", "UNIX stream socket to connect to")
	flag.Parse()
	if err := run(*tap, *addr, *mtu, *listen, *connect); err != nil {
		fmt.Fprintln(os.Stderr, "naiverelay:", err)
		os.Exit(1)
	}
}

func run(tap, addr string, mtu int, listen, connect string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF: %w", err)
	}
	for _, args := range [][]string{
		{"link", "set", tap, "mtu", strconv.Itoa(mtu)},
		{"addr", "add", addr, "dev", tap},
		{"link", "set", tap, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	var c net.Conn
	if listen != "" {
		os.Remove(listen)
		ln, err := net.Listen("unix", listen)
		if err != nil {
			return err
		}
		c, err = ln.Accept()
		if err != nil {
			return err
		}
	} else {
		for {
			if c, err = net.Dial("unix", connect); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	errc := make(chan error, 2)
	go func() { // TAP -> socket: one read, one write per frame
		buf := make([]byte, 4+65536)
		for {
			n, err := unix.Read(fd, buf[4:])
			if err != nil {
				errc <- err
				return
			}
			binary.BigEndian.PutUint32(buf, uint32(n))
			if _, err := c.Write(buf[:4+n]); err != nil {
				errc <- err
				return
			}
		}
	}()
	go func() { // socket -> TAP: one frame at a time
		buf := make([]byte, 65536+4096)
		for {
			if _, err := io.ReadFull(c, buf[:4]); err != nil {
				errc <- err
				return
			}
			n := int(binary.BigEndian.Uint32(buf))
			if n > len(buf) {
				errc <- fmt.Errorf("frame of %d bytes", n)
				return
			}
			if _, err := io.ReadFull(c, buf[:n]); err != nil {
				errc <- err
				return
			}
			unix.Write(fd, buf[:n]) // a refused frame is dropped, as a NIC would
		}
	}()
	return <-errc
}
