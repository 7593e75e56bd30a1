package tapdev

import (
	"strings"
	"testing"
)

// Tests that need neither root nor Linux.

func TestDescribeMismatch(t *testing.T) {
	tests := []struct {
		name                  string
		wantMQ, tap, vnet, mq bool
		wantSubstr            string // "" = no error
	}{
		{"good single", false, true, true, false, ""},
		{"good mq", true, true, true, true, ""},
		{"no vnet_hdr", false, true, false, false,
			`tap "tap0" exists without vnet_hdr; recreate it with: ip tuntap del dev tap0 mode tap && ip tuntap add dev tap0 mode tap vnet_hdr`},
		{"no vnet_hdr mq", true, true, false, true,
			"ip tuntap add dev tap0 mode tap vnet_hdr multi_queue"},
		{"mq exists, single asked", false, true, true, true,
			`tap "tap0" exists with multi_queue but a single queue was asked for`},
		{"single exists, mq asked", true, true, true, false,
			`tap "tap0" exists without multi_queue but multiqueue was asked for`},
		{"tun", false, false, true, false,
			"ip tuntap del dev tap0 mode tun && ip tuntap add dev tap0 mode tap vnet_hdr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := describeMismatch("tap0", tt.wantMQ, tt.tap, tt.vnet, tt.mq)
			switch {
			case tt.wantSubstr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantSubstr != "" && err == nil:
				t.Fatalf("no error, want one containing %q", tt.wantSubstr)
			case err != nil && !strings.Contains(err.Error(), tt.wantSubstr):
				t.Fatalf("error %q does not contain %q", err, tt.wantSubstr)
			}
		})
	}
}
