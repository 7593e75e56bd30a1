package netdev

import "testing"

func TestSpecPortCaps(t *testing.T) {
	for _, c := range []struct {
		spec string
		hdr  int
	}{
		{"stream,server=on,addr.type=unix,addr.path=/x", 0},
		{"stream,server=on,addr.type=unix,addr.path=/x,vnet-hdr=on", 12},
		{"dgram,local.type=unix,local.path=/a,remote.type=unix,remote.path=/b", 0},
	} {
		sp, err := ParseSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := sp.PortCaps(); got.HdrLen != c.hdr || (c.hdr == 0) != (got.Accepts == 0) {
			t.Errorf("%s: %+v", c.spec, got)
		}
	}
}
