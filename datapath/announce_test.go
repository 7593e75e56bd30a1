package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"tapgro/vnethdr"
)

func TestAnnounceFrames(t *testing.T) {
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x42}
	frames := announceFrames(mac, []netip.Prefix{
		netip.MustParsePrefix("198.18.0.1/24"),
		netip.MustParsePrefix("fd00:198:18::1/64"),
	})
	if len(frames) != 2 {
		t.Fatalf("got %d frames, want a gratuitous ARP and a neighbour advertisement", len(frames))
	}
	arp := frames[0]
	if binary.BigEndian.Uint16(arp[12:]) != 0x0806 || string(arp[14+8:14+14]) != string(mac) ||
		string(arp[14+14:14+18]) != string(arp[14+24:14+28]) || arp[14+14] != 198 {
		t.Errorf("gratuitous ARP malformed: % x", arp[:42])
	}
	na := frames[1]
	if binary.BigEndian.Uint16(na[12:]) != 0x86dd || na[14+7] != 255 || na[54] != 136 {
		t.Fatalf("neighbour advertisement malformed: % x", na)
	}
	icmp := na[54:]
	if got := vnethdr.Checksum(icmp, vnethdr.PseudoHeaderSum(58, na[14+8:14+24], na[14+24:14+40], len(icmp))); got != 0 {
		t.Errorf("ICMPv6 checksum does not verify (residue %#04x)", got)
	}
	if binary.BigEndian.Uint32(icmp[4:])&(1<<29) == 0 || string(icmp[26:32]) != string(mac) {
		t.Errorf("NA lacks the override flag or the target link-layer address: % x", icmp)
	}
}

// The start-up probe must be a frame the kernel accepts when it accepts GSO at all:
// vnethdr's own splitter, which applies the kernel's rules, must take it.
func TestProbeFrameIsValidGSO(t *testing.T) {
	for _, hl := range []int{10, 12} {
		pkt := buildProbeFrame(hl)
		var h vnethdr.Hdr
		if err := h.Decode(pkt, hl); err != nil {
			t.Fatal(err)
		}
		out := [][]byte{make([]byte, 100), make([]byte, 100)}
		sizes := make([]int, 2)
		n, err := vnethdr.Split(pkt[hl:], &h, out, sizes)
		if err != nil || n != 2 {
			t.Fatalf("hdr len %d: Split = %d, %v; want 2 segments", hl, n, err)
		}
	}
}
