package netmapio

import (
	"tapgro/port"

	"fmt"
	"os"
	"tapgro/port/porttest"
	"testing"
	"time"
)

// netmapSkip is why the real-module test does not run here. It skips even under
// TAPGRO_REQUIRE_PRIV=1: privileges cannot load an out-of-tree module this machine does
// not have, and the same code runs against the in-process model in every build.
const netmapSkip = "netmap module not loaded (/dev/netmap missing); the netmap path is verified against the in-process model"

// TestNetmapReal opens two ports of a VALE switch through the real module and sends
// frames both ways, with no header and with a 12-byte header (multi-slot GSO-sized
// frames). VALE port names allow only letters, digits and '_', so the switch is
// vale_tapgro0.
func TestNetmapReal(t *testing.T) {
	if _, err := os.Stat(DevicePath); err != nil {
		t.Skip(netmapSkip)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
			t.Fatalf("%s exists but the test is not root, and TAPGRO_REQUIRE_PRIV=1 forbids skipping", DevicePath)
		}
		t.Skipf("%s needs root", DevicePath)
	}
	porttest.CheckLeaks(t)
	for _, hl := range []int{0, 12} {
		t.Run(fmt.Sprintf("hdr%d", hl), func(t *testing.T) {
			open := func(name string) port.Port {
				p, err := Open("vale_tapgro0:"+name, hl, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				return p
			}
			a, b := open("1"), open("2")
			if a.VnetHdrLen() != hl || b.VnetHdrLen() != hl {
				t.Fatalf("header lengths %d/%d, want %d", a.VnetHdrLen(), b.VnetHdrLen(), hl)
			}
			// Without a header VALE's frame limit is 1514 bytes; with one, frames of any
			// size cross between equal-length ports (NM_BDG_MFS_DEFAULT in netmap
			// sys/dev/netmap/netmap_bdg.h; a header length raises the port's limit to the
			// buffer size, sys/dev/netmap/netmap.c).
			sizes := []int{60, 1514}
			if hl > 0 {
				sizes = append(sizes, 9000, 65536)
			}
			var frames [][]byte
			for i, n := range sizes {
				f := make([]byte, hl+n)
				copy(f[hl:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, byte(i), 0x88, 0xb5})
				for j := hl + 14; j < len(f); j++ {
					f[j] = byte(j) ^ byte(i)
				}
				frames = append(frames, f)
			}
			for _, dir := range [][2]port.Port{{a, b}, {b, a}} {
				if n, err := dir[0].WriteBatch(frames); n != len(frames) || err != nil {
					t.Fatalf("WriteBatch = %d, %v", n, err)
				}
				dir[1].SetReadDeadline(time.Now().Add(5 * time.Second))
				porttest.ReadFrames(t, dir[1], frames)
				dir[1].SetReadDeadline(time.Time{})
			}
		})
	}
}
