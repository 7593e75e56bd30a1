package netmapio

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
)

func TestParseSpecNetmap(t *testing.T) {
	tests := []struct {
		in   string
		want Spec
		str  string
		qemu string // QEMUOption("n0")
	}{
		{"netmap,ifname=vale0:2,vnet-hdr=12",
			Spec{Backend: BackendNetmap, Role: RoleAttach, IfName: "vale0:2", HdrLen: 12},
			"netmap,ifname=vale0:2,vnet-hdr=12", "netmap,id=n0,ifname=vale0:n0"},
		{"netmap,id=x,ifname=vale0:n0,vnet-hdr=0",
			Spec{Backend: BackendNetmap, Role: RoleAttach, IfName: "vale0:n0"},
			"netmap,ifname=vale0:n0", "netmap,id=n0,ifname=vale0:n0_q"},
		{"netmap,ifname=vale_tapgro0:1,vnet-hdr=10",
			Spec{Backend: BackendNetmap, Role: RoleAttach, IfName: "vale_tapgro0:1", HdrLen: 10},
			"netmap,ifname=vale_tapgro0:1,vnet-hdr=10", "netmap,id=n0,ifname=vale_tapgro0:n0"},
		{"netmap,ifname=netmap:eth0",
			Spec{Backend: BackendNetmap, Role: RoleAttach, IfName: "netmap:eth0"},
			"netmap,ifname=netmap:eth0", ""},
		{"netmap,ifname=netmap:pipe0{1",
			Spec{Backend: BackendNetmap, Role: RoleAttach, IfName: "netmap:pipe0{1"},
			"netmap,ifname=netmap:pipe0{1", "netmap,id=n0,ifname=netmap:pipe0}1"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ParseSpec = %+v, want %+v", got, tt.want)
			}
			if s := got.String(); s != tt.str {
				t.Errorf("String = %q, want %q", s, tt.str)
			}
			if q := got.QEMUOption("n0"); q != tt.qemu {
				t.Errorf("QEMUOption = %q, want %q", q, tt.qemu)
			}
			if again, err := ParseSpec(got.String()); err != nil || again != got {
				t.Errorf("ParseSpec(String()) = %+v, %v", again, err)
			}
		})
	}
}

func TestParseSpecNetmapBad(t *testing.T) {
	tests := []struct{ in, wantErr string }{
		{"netmap", `needs key "ifname"`},
		{"netmap,ifname=", `needs key "ifname"`},
		{"netmap,ifname=vale0:1,vnet-hdr=11", `bad value "11" for key "vnet-hdr"`},
		{"netmap,ifname=vale0:1,vnet-hdr=on", `bad value "on" for key "vnet-hdr"`},
		{"netmap,ifname=netmap:eth0,vnet-hdr=12", "needs a VALE port"},
		{"netmap,ifname=vale0", "valeSWITCH:PORT"},
		{"netmap,ifname=vale0:", "valeSWITCH:PORT"},
		{"netmap,ifname=vale-x:1", `switch name "vale-x"`},
		{"netmap,ifname=vale0:a-b", `port name "a-b"`},
		{"netmap,ifname=vale0:" + strings.Repeat("p", 16), "port name"},
		{"netmap,ifname=netmap:", "bad value"},
		{"netmap,ifname=netmap:a/b", "bad value"},
		{"netmap,ifname=" + strings.Repeat("e", 64), "bad value"},
		{"netmap,ifname=vale0:1,devname=/dev/netmap", `unknown key "devname"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := ParseSpec(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "netdev: ") {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestParseNetmapName(t *testing.T) {
	for in, want := range map[string]nmName{
		"netmap:eth0":  {kernel: "eth0", mode: nrRegAllNIC},
		"eth0":         {kernel: "eth0", mode: nrRegAllNIC},
		"netmap:eth0^": {kernel: "eth0", mode: nrRegSW},
		"netmap:eth0*": {kernel: "eth0", mode: nrRegNICSW},
		"netmap:p{3":   {kernel: "p{3", mode: nrRegAllNIC},
		"vale0:vm1":    {kernel: "vale0:vm1", mode: nrRegAllNIC, vale: true, bridge: "vale0", port: "vm1"},
	} {
		got, err := parseNetmapName(in)
		if err != nil || got != want {
			t.Errorf("parseNetmapName(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// TestNetmapMissingModule: without /dev/netmap, Open fails at once and says why.
func TestNetmapMissingModule(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("netmap is Linux-only here")
	}
	if _, err := os.Stat(nmDevicePath); err == nil {
		t.Skip("/dev/netmap exists: the module is loaded (TestNetmapReal covers it)")
	}
	sp, err := ParseSpec("netmap,ifname=vale0:1,vnet-hdr=12")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := Open(sp, Events{})
	if err == nil {
		ep.Close()
		t.Fatal("Open succeeded without /dev/netmap")
	}
	if !errors.Is(err, ErrNoNetmap) || !strings.Contains(err.Error(), "modprobe netmap") || !strings.Contains(err.Error(), "out-of-tree") {
		t.Fatalf("error %q does not say the module is needed", err)
	}
}
