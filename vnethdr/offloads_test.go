package vnethdr

import (
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	const (
		csum = OffloadCSUM
		tso4 = OffloadTSO4
		tso6 = OffloadTSO6
		ecn  = OffloadTSOECN
		ufo  = OffloadUFO
		uso4 = OffloadUSO4
		uso6 = OffloadUSO6
	)
	tests := []struct {
		name     string
		in, want Offloads
	}{
		{"none", 0, 0},
		{"csum only", csum, csum},
		{"tso without csum", tso4 | tso6, 0},
		{"everything without csum", tso4 | tso6 | ecn | ufo | uso4 | uso6, 0},
		{"tso4", csum | tso4, csum | tso4},
		{"ecn without tso", csum | ecn, csum},
		{"ecn with tso6", csum | tso6 | ecn, csum | tso6 | ecn},
		{"uso4 alone", csum | uso4, csum},
		{"uso6 alone", csum | uso6, csum},
		{"uso pair", csum | uso4 | uso6, csum | OffloadUSO},
		{"ufo", csum | ufo, csum | ufo},
		{"unknown bits dropped", csum | 0x80 | 0x100, csum},
		{"all", 0x7f, 0x7f},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.Normalize(); got != tt.want {
				t.Errorf("(%s).Normalize() = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseChoice(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Choice
		err  string
	}{
		{"auto", Choice{Auto: true}, ""},
		{"", Choice{Auto: true}, ""},
		{"off", Choice{}, ""},
		{"none", Choice{}, ""},
		{"csum", Choice{Set: OffloadCSUM}, ""},
		{"csum,tso4,tso6,tso_ecn,uso", Choice{Set: OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUSO}, ""},
		{"csum, ecn", Choice{Set: OffloadCSUM | OffloadTSOECN}, ""},
		{"csum,ufo", Choice{Set: OffloadCSUM | OffloadUFO}, ""},
		{"tso4", Choice{}, "needs csum"},
		{"csum,gso", Choice{}, `unknown offload "gso"`},
		{"csum,", Choice{}, `unknown offload ""`},
		{"csum,uso4", Choice{}, `unknown offload "uso4"`},
	} {
		got, err := ParseChoice(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseChoice(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseChoice(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// Every name String prints parses back to its bit, except the USO halves, which the
// kernel takes only as a pair.
func TestOffloadNamesRoundTrip(t *testing.T) {
	for _, n := range offloadNames {
		bit, ok := OffloadByName(n.name)
		if n.bit&OffloadUSO != 0 {
			if ok {
				t.Errorf("OffloadByName(%q) accepted half of the USO pair", n.name)
			}
			continue
		}
		if !ok || bit != n.bit {
			t.Errorf("OffloadByName(%q) = %s, %v", n.name, bit, ok)
		}
	}
}

// Partition sorts exactly the kinds a sender produces, each by AcceptsFrame.
func TestPartition(t *testing.T) {
	const all = OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUFO | OffloadUSO
	for _, c := range []struct {
		recv, sent, whole, refused Offloads
	}{
		{0, 0, 0, 0},
		{all, all, OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUSO, 0},
		{0, all, 0, OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUSO},
		{OffloadCSUM, OffloadCSUM | OffloadTSO4, OffloadCSUM, OffloadTSO4},
		{OffloadCSUM | OffloadTSO4 | OffloadTSOECN, OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN,
			OffloadCSUM | OffloadTSO4 | OffloadTSOECN, OffloadTSO6 | OffloadTSOECN},
		{OffloadCSUM | OffloadUSO4, OffloadCSUM | OffloadUSO, OffloadCSUM, OffloadUSO},
		{OffloadCSUM | OffloadUSO, OffloadCSUM | OffloadUSO4, OffloadCSUM, 0},  // half a pair sends no USO
		{OffloadTSO4, OffloadCSUM | OffloadTSO4, 0, OffloadCSUM | OffloadTSO4}, // GSO needs CSUM too
	} {
		whole, refused := c.recv.Partition(c.sent)
		if whole != c.whole || refused != c.refused {
			t.Errorf("%s.Partition(%s) = %s, %s; want %s, %s", c.recv, c.sent, whole, refused, c.whole, c.refused)
		}
	}
}
