package netdev

import (
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
