package netmapio

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
)

func TestParseNetmapName(t *testing.T) {
	for in, want := range map[string]Name{
		"netmap:eth0":  {kernel: "eth0", mode: nrRegAllNIC},
		"eth0":         {kernel: "eth0", mode: nrRegAllNIC},
		"netmap:eth0^": {kernel: "eth0", mode: nrRegSW},
		"netmap:eth0*": {kernel: "eth0", mode: nrRegNICSW},
		"netmap:p{3":   {kernel: "p{3", mode: nrRegAllNIC},
		"vale0:vm1":    {kernel: "vale0:vm1", mode: nrRegAllNIC, vale: true, bridge: "vale0", port: "vm1"},
	} {
		got, err := ParseName(in)
		if err != nil || got != want {
			t.Errorf("ParseName(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// TestNetmapMissingModule: without /dev/netmap, Open fails at once and says why.
func TestNetmapMissingModule(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("netmap is Linux-only here")
	}
	if _, err := os.Stat(DevicePath); err == nil {
		t.Skip("/dev/netmap exists: the module is loaded (TestNetmapReal covers it)")
	}
	p, err := Open("vale0:1", 12, nil, nil)
	if err == nil {
		p.Close()
		t.Fatal("Open succeeded without /dev/netmap")
	}
	if !errors.Is(err, ErrNoNetmap) || !strings.Contains(err.Error(), "modprobe netmap") || !strings.Contains(err.Error(), "out-of-tree") {
		t.Fatalf("error %q does not say the module is needed", err)
	}
}
