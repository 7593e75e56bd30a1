package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"tapgro/netdev"
	"tapgro/ops"
	"tapgro/rxpool"
	"tapgro/vnethdr"
)

func TestParseFlags(t *testing.T) {
	const nd = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/t.sock"
	good := []struct {
		name  string
		args  []string
		check func(*testing.T, *options)
	}{
		{"defaults", []string{"--tap", "tap0", nd}, func(t *testing.T, o *options) {
			if !o.gro || !o.udpGRO || !o.offload.Auto || o.vnetHdrLen != 10 || o.groFlush != "auto" || o.timerFlush(false) || !o.timerFlush(true) || o.batch != 64 || o.maxFlows != 64 {
				t.Errorf("unexpected defaults: %+v", o)
			}
		}},
		{"everything", []string{"--tap", "tap0", nd, "--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64",
			"--mtu", "9000", "--gro", "off", "--offload", "csum,tso4", "--log-level", "trace", "--log-format", "json",
			"--metrics-addr", "127.0.0.1:9100", "--vnet-hdr-len", "12", "--gro-flush", "timer", "--rsc-interval", "300us"},
			func(t *testing.T, o *options) {
				if len(o.addrs) != 2 || o.mtu != 9000 || o.gro || o.offload.Set != vnethdr.OffloadCSUM|vnethdr.OffloadTSO4 ||
					o.logFormat != "json" || o.vnetHdrLen != 12 || o.groFlush != "timer" || o.rscInterval != 300*time.Microsecond {
					t.Errorf("parsed wrong: %+v", o)
				}
			}},
		{"offload off", []string{"--tap", "tap0", nd, "--offload", "off"}, func(t *testing.T, o *options) {
			if o.offload.Auto || o.offload.Set != 0 {
				t.Errorf("--offload off parsed as %v", o.offload)
			}
		}},
		{"remote metrics allowed", []string{"--tap", "tap0", nd, "--metrics-addr", "198.18.0.1:9100", "--allow-remote"}, nil},
		{"ipv6 loopback metrics", []string{"--tap", "tap0", nd, "--metrics-addr", "[::1]:9100"}, nil},
		{"rx defaults", []string{"--tap", "tap0", nd}, func(t *testing.T, o *options) {
			if o.rx.BufSize != 2048 || o.rx.Bytes != 4<<20 || o.rx.FlushDelay != rxpool.DefaultFlushDelay ||
				o.rx.FlushThreshold != 0 || o.rx.FlushThresholdFrac != 0 || o.rx.PerFrame {
				t.Errorf("rx defaults: %+v", o.rx)
			}
		}},
		{"rx-buf-size", []string{"--tap", "tap0", nd, "--rx-buf-size", "4K"}, func(t *testing.T, o *options) {
			if o.rx.BufSize != 4096 {
				t.Errorf("--rx-buf-size 4K = %d", o.rx.BufSize)
			}
		}},
		{"rx-pool-bytes", []string{"--tap", "tap0", nd, "--rx-pool-bytes", "16M"}, func(t *testing.T, o *options) {
			if o.rx.Bytes != 16<<20 {
				t.Errorf("--rx-pool-bytes 16M = %d", o.rx.Bytes)
			}
		}},
		{"rx-flush-delay", []string{"--tap", "tap0", nd, "--rx-flush-delay", "200us"}, func(t *testing.T, o *options) {
			if o.rx.FlushDelay != 200*time.Microsecond {
				t.Errorf("--rx-flush-delay 200us = %v", o.rx.FlushDelay)
			}
		}},
		{"rx-flush-delay 0", []string{"--tap", "tap0", nd, "--rx-flush-delay", "0"}, func(t *testing.T, o *options) {
			if o.rx.FlushDelay >= 0 {
				t.Errorf("--rx-flush-delay 0 = %v, want negative (no delay)", o.rx.FlushDelay)
			}
		}},
		{"call-interval", []string{"--tap", "tap0", nd, "--call-interval", "200us", "--rx-flush-delay", "0"}, func(t *testing.T, o *options) {
			// One flag, one meaning: the pool's delay no longer moves vhost-user's calls.
			if o.callInterval != 200*time.Microsecond || o.rx.FlushDelay >= 0 {
				t.Errorf("--call-interval 200us --rx-flush-delay 0 = %v, %v", o.callInterval, o.rx.FlushDelay)
			}
		}},
		{"tx-hold", []string{"--tap", "tap0", nd, "--tx-hold", "0"}, func(t *testing.T, o *options) {
			if o.txHold != 0 {
				t.Errorf("--tx-hold 0 = %v", o.txHold)
			}
		}},
		{"rx-flush-threshold bytes", []string{"--tap", "tap0", nd, "--rx-flush-threshold", "256K"}, func(t *testing.T, o *options) {
			if o.rx.FlushThreshold != 256<<10 {
				t.Errorf("--rx-flush-threshold 256K = %d", o.rx.FlushThreshold)
			}
		}},
		{"rx-flush-threshold percent", []string{"--tap", "tap0", nd, "--rx-flush-threshold", "50%"}, func(t *testing.T, o *options) {
			if o.rx.FlushThresholdFrac != 0.5 {
				t.Errorf("--rx-flush-threshold 50%% = %v", o.rx.FlushThresholdFrac)
			}
		}},
		{"rx-batch off", []string{"--tap", "tap0", nd, "--rx-batch", "off"}, func(t *testing.T, o *options) {
			if !o.rx.PerFrame {
				t.Error("--rx-batch off did not set PerFrame")
			}
		}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}

	bad := []struct {
		name string
		args []string
		want string // a substring the error must contain: the key at fault
	}{
		{"no tap", []string{nd}, "--tap"},
		{"no netdev", []string{"--tap", "tap0"}, "--netdev"},
		{"long name", []string{"--tap", "a-very-long-tap-name", nd}, "15 bytes"},
		{"bad netdev key", []string{"--tap", "tap0", "--netdev", "stream,server=on,adr.type=unix"}, "adr.type"},
		{"bad mtu", []string{"--tap", "tap0", nd, "--mtu", "70000"}, "--mtu"},
		{"bad gro", []string{"--tap", "tap0", nd, "--gro", "maybe"}, "--gro"},
		{"bad offload", []string{"--tap", "tap0", nd, "--offload", "tso9"}, "tso9"},
		{"offload without csum", []string{"--tap", "tap0", nd, "--offload", "tso4"}, "csum"},
		{"bad level", []string{"--tap", "tap0", nd, "--log-level", "loud"}, "--log-level"},
		{"bad format", []string{"--tap", "tap0", nd, "--log-format", "xml"}, "--log-format"},
		{"remote metrics", []string{"--tap", "tap0", nd, "--metrics-addr", "198.18.0.1:9100"}, "--allow-remote"},
		{"bad hdr len", []string{"--tap", "tap0", nd, "--vnet-hdr-len", "11"}, "--vnet-hdr-len"},
		{"bad flush", []string{"--tap", "tap0", nd, "--gro-flush", "sometimes"}, "--gro-flush"},
		{"stray arg", []string{"--tap", "tap0", nd, "extra"}, "extra"},
		{"bad addr", []string{"--tap", "tap0", nd, "--addr", "198.18.0.1"}, "prefix"},
		{"bad rx-buf-size", []string{"--tap", "tap0", nd, "--rx-buf-size", "16"}, "--rx-buf-size"},
		{"bad rx-buf-size unit", []string{"--tap", "tap0", nd, "--rx-buf-size", "2KB"}, "--rx-buf-size"},
		{"small rx-pool-bytes", []string{"--tap", "tap0", nd, "--rx-pool-bytes", "64K"}, "--rx-pool-bytes"},
		{"rx-pool-bytes one buffer", []string{"--tap", "tap0", nd, "--rx-buf-size", "1M", "--rx-pool-bytes", "1M"}, "--rx-pool-bytes"},
		// 16 Mi descriptors and header slots (~3 GiB beside the slab): refused.
		{"rx-pool too many buffers", []string{"--tap", "tap0", nd, "--rx-buf-size", "64", "--rx-pool-bytes", "1G"}, "2..262144 buffers"},
		{"bad rx-flush-delay", []string{"--tap", "tap0", nd, "--rx-flush-delay", "2s"}, "--rx-flush-delay"},
		{"bad call-interval", []string{"--tap", "tap0", nd, "--call-interval", "2s"}, "--call-interval"},
		{"bad tx-hold", []string{"--tap", "tap0", nd, "--tx-hold", "2ms"}, "--tx-hold"},
		{"negative rx-flush-delay", []string{"--tap", "tap0", nd, "--rx-flush-delay", "-1ms"}, "--rx-flush-delay"},
		{"bad rx-flush-threshold", []string{"--tap", "tap0", nd, "--rx-flush-threshold", "lots"}, "--rx-flush-threshold"},
		{"bad rx-flush-threshold percent", []string{"--tap", "tap0", nd, "--rx-flush-threshold", "150%"}, "--rx-flush-threshold"},
		{"bad rx-batch", []string{"--tap", "tap0", nd, "--rx-batch", "sometimes"}, "--rx-batch"},
		{"negative procs", []string{"--tap", "tap0", nd, "--procs", "-1"}, "--procs"},
	}
	for _, tc := range bad {
		t.Run("bad/"+tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args, io.Discard)
			if err == nil {
				t.Fatalf("parseFlags(%q) accepted bad input", tc.args)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

// TAPGRO_GRO, TAPGRO_UDP_GRO and TAPGRO_OFFLOAD set the switches a flag does not; a
// flag on the command line wins; a bad value is reported under the variable's name.
func TestParseFlagsEnv(t *testing.T) {
	const nd = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/t.sock"
	for _, c := range []struct {
		name    string
		env     map[string]string
		args    []string
		gro     bool
		udpGRO  bool
		offload string
		err     string
	}{
		{name: "no environment", gro: true, udpGRO: true, offload: "auto"},
		{name: "environment only", env: map[string]string{"TAPGRO_GRO": "off", "TAPGRO_UDP_GRO": "off", "TAPGRO_OFFLOAD": "csum,tso4"},
			offload: "csum,tso4"},
		{name: "flags win", env: map[string]string{"TAPGRO_GRO": "off", "TAPGRO_UDP_GRO": "off", "TAPGRO_OFFLOAD": "off"},
			args: []string{"--gro", "on", "--udp-gro=on", "--offload", "csum,tso6"}, gro: true, udpGRO: true, offload: "csum,tso6"},
		{name: "some from each", env: map[string]string{"TAPGRO_GRO": "off", "TAPGRO_OFFLOAD": "off"},
			args: []string{"--gro", "on"}, gro: true, udpGRO: true, offload: "off"},
		{name: "empty is unset", env: map[string]string{"TAPGRO_GRO": "", "TAPGRO_OFFLOAD": ""}, gro: true, udpGRO: true, offload: "auto"},
		{name: "bad gro", env: map[string]string{"TAPGRO_GRO": "maybe"}, err: `TAPGRO_GRO="maybe"`},
		{name: "bad udp gro", env: map[string]string{"TAPGRO_UDP_GRO": "2"}, err: `TAPGRO_UDP_GRO="2"`},
		{name: "bad offload", env: map[string]string{"TAPGRO_OFFLOAD": "tso4"}, err: `TAPGRO_OFFLOAD="tso4"`},
		{name: "bad env hidden by a flag", env: map[string]string{"TAPGRO_GRO": "maybe"}, args: []string{"--gro", "off"},
			udpGRO: true, offload: "auto"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{"TAPGRO_GRO", "TAPGRO_UDP_GRO", "TAPGRO_OFFLOAD"} {
				t.Setenv(k, "")
			}
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			o, err := parseFlags(append([]string{"--tap", "tap0", nd}, c.args...), io.Discard)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one naming %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.gro != c.gro || o.udpGRO != c.udpGRO || o.offload.String() != c.offload {
				t.Errorf("gro %v udp-gro %v offload %s; want %v %v %s", o.gro, o.udpGRO, o.offload, c.gro, c.udpGRO, c.offload)
			}
		})
	}
}

// --ctl-socket: the default path is per TAP, "" disables it, an explicit path is kept.
func TestParseFlagsCtlSocket(t *testing.T) {
	const nd = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/t.sock"
	o, err := parseFlags([]string{"--tap", "tap0", nd}, io.Discard)
	if err != nil || o.ctlSocket != "/run/tapgro/tap0.ctl" || !o.ctlSocketDefault {
		t.Errorf("default: %q (default %v), %v", o.ctlSocket, o.ctlSocketDefault, err)
	}
	o, err = parseFlags([]string{"--tap", "tap0", nd, "--ctl-socket", ""}, io.Discard)
	if err != nil || o.ctlSocket != "" || o.ctlSocketDefault {
		t.Errorf(`--ctl-socket "": %q (default %v), %v`, o.ctlSocket, o.ctlSocketDefault, err)
	}
	o, err = parseFlags([]string{"--tap", "tap0", nd, "--ctl-socket", "/tmp/x.ctl"}, io.Discard)
	if err != nil || o.ctlSocket != "/tmp/x.ctl" || o.ctlSocketDefault {
		t.Errorf("--ctl-socket /tmp/x.ctl: %q (default %v), %v", o.ctlSocket, o.ctlSocketDefault, err)
	}
	if _, err := parseFlags([]string{"--tap", "tap0", nd, "--ctl-socket", "/" + strings.Repeat("x", 120)}, io.Discard); err == nil {
		t.Error("a 121-byte socket path was accepted")
	}
}

// --offload (flags and TAPGRO_OFFLOAD) and `tapgro ctl offload` read offload lists with
// one parser, so a list one accepts the other accepts too, with the same meaning.
func TestOffloadListsOneParser(t *testing.T) {
	for _, s := range []string{"auto", "off", "csum", "csum,ufo", "csum,tso4,tso6,tso_ecn,uso", "csum,ecn", "tso4", "csum,gso", "csum,uso4"} {
		flag, ferr := parseOffloads(s)
		_, rerr := ops.ParseRequest("offload " + s)
		ctl, cerr := ops.ParseOffloadList(s)
		if (ferr == nil) != (cerr == nil) || (ferr == nil) != (rerr == nil) {
			t.Errorf("%q: --offload says %v, ctl says %v (request: %v)", s, ferr, cerr, rerr)
			continue
		}
		if ferr == nil && ctl != flag {
			t.Errorf("%q: --offload means %v, ctl means %v", s, flag, ctl)
		}
	}
}

func TestParseFlagsVhostUser(t *testing.T) {
	const nd = "--netdev=vhost-user,path=/run/vu.sock"
	o, err := parseFlags([]string{"--tap", "tap0", nd}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	const args = "-object memory-backend-memfd,id=mem,size=<RAM>,share=on -machine memory-backend=mem" +
		" -chardev socket,id=vu0,path=/run/vu.sock,%s -netdev vhost-user,id=n0,chardev=vu0" +
		" -device virtio-net-pci,netdev=n0"
	for _, tc := range []struct {
		ver  string
		want string
	}{
		{"7.2", "give QEMU 7.2: " + fmt.Sprintf(args, "reconnect=1") +
			" (RAM = the guest's -m size; under TCG, not KVM, the NIC needs vectors=0: -device virtio-net-pci,netdev=n0,vectors=0)"},
		{"10.0", "give QEMU 10.0: " + fmt.Sprintf(args, "reconnect-ms=1000") + " (RAM = the guest's -m size)"},
	} {
		o, err := parseFlags([]string{"--tap", "tap0", nd, "--qemu-version", tc.ver}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := vhostUserHint(o.netdev, resolveQEMU(o)); got != tc.want {
			t.Errorf("QEMU %s hint:\n %s\nwant\n %s", tc.ver, got, tc.want)
		}
	}
	if got := vhostUserHint(o.netdev, netdev.QEMUVersion{}); !strings.Contains(got, "reconnect-ms=1000") ||
		!strings.Contains(got, "before 9.2 the chardev takes reconnect=1") || !strings.Contains(got, "vectors=0") {
		t.Errorf("hint for an unknown QEMU: %s", got)
	}
	if _, err := parseFlags([]string{"--tap", "tap0", nd, "--qemu-version", "ten"}, io.Discard); err == nil {
		t.Error("--qemu-version ten accepted")
	}
	for _, bad := range []struct {
		args []string
		why  string
	}{
		{[]string{"--multi-queue"}, "queues=N"},
	} {
		_, err := parseFlags(append([]string{"--tap", "tap0", nd}, bad.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("%v: err = %v, want %q", bad.args, err, bad.why)
		}
	}
	for _, good := range [][]string{{"--pcap-port", "/tmp/x.pcap"}, {"--pcap-tap", "/tmp/t.pcap"}, {"--ctl-socket", "/tmp/x.ctl"},
		{"--gro", "off"}, {"--offload", "off"}, {"--gro-flush", "batch", "--rsc-interval", "1ms", "--gro-flows", "8"}} {
		if _, err := parseFlags(append([]string{"--tap", "tap0", nd}, good...), io.Discard); err != nil {
			t.Errorf("%v: %v", good, err)
		}
	}
	// queues=2: QEMU's netdev and NIC say so too.
	o, err = parseFlags([]string{"--tap", "tap0", nd + ",queues=2"}, io.Discard)
	if err != nil {
		t.Fatalf("queues=2: %v", err)
	}
	kvm := vhostUserHint(o.netdev, netdev.QEMUVersion{})
	if !strings.Contains(kvm, " -netdev vhost-user,id=n0,chardev=vu0,queues=2 -device virtio-net-pci,netdev=n0,mq=on") {
		t.Errorf("queues=2: QEMU args %s", kvm)
	}
	// server=off: QEMU listens, so its chardev is the server.
	o, err = parseFlags([]string{"--tap", "tap0", nd + ",server=off"}, io.Discard)
	if err != nil {
		t.Fatalf("server=off: %v", err)
	}
	kvm = vhostUserHint(o.netdev, netdev.QEMUVersion{})
	if !strings.Contains(kvm, " -chardev socket,id=vu0,path=/run/vu.sock,server=on,wait=off -netdev vhost-user,id=n0,chardev=vu0 ") {
		t.Errorf("server=off: QEMU args %s", kvm)
	}
}

// GOMAXPROCS: --procs wins, then a valid GOMAXPROCS variable, both fixed; else one
// scaled with the load, vhost-user included.
func TestProcsFor(t *testing.T) {
	const stream = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/x.sock"
	const vhost = "--netdev=vhost-user,path=/run/vu.sock,queues=4"
	for _, c := range []struct {
		args  []string
		env   string
		cpus  int
		want  int
		scale bool
	}{
		{[]string{stream}, "", 2, 1, true},
		{[]string{stream}, "", 1, 1, false},
		{[]string{vhost}, "", 8, 1, true},
		{[]string{stream}, "3", 2, 3, false},
		{[]string{stream}, "zero", 2, 1, true}, // the runtime ignores it too
		{[]string{stream}, "0", 2, 1, true},
		{[]string{stream, "--procs", "2"}, "3", 2, 2, false},
		{[]string{vhost, "--procs", "1"}, "", 8, 1, false},
	} {
		o, err := parseFlags(append([]string{"--tap", "tap0"}, c.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got, scale, why := procsFor(o, c.env, c.cpus); got != c.want || scale != c.scale {
			t.Errorf("%v GOMAXPROCS=%q on %d CPUs: %d, scale %v (%s); want %d, %v", c.args, c.env, c.cpus, got, scale, why, c.want, c.scale)
		}
	}
}

// Both directions count as parallel work only when each delivered bothWayRate over the
// interval; a bulk transfer's ACK stream does not.
func TestBothWays(t *testing.T) {
	var tp, pt uint64
	busy := bothWays(func() (uint64, uint64) { return tp, pt })
	const rate = bothWayRate
	for _, c := range []struct {
		dt, dp uint64
		wall   time.Duration
		want   bool
	}{
		{rate, rate, time.Second, true},
		{rate, 1 << 20, time.Second, false}, // bulk one way, ACKs the other
		{1 << 20, rate, time.Second, false},
		{rate, rate, 2 * time.Second, false}, // half the rate
		{2 * rate, 2 * rate, 2 * time.Second, true},
		{0, 0, time.Second, false},
	} {
		tp += c.dt
		pt += c.dp
		if got := busy(c.wall); got != c.want {
			t.Errorf("%d / %d bytes in %v: parallel %v, want %v", c.dt, c.dp, c.wall, got, c.want)
		}
	}
}

// TestVhostConventions: QEMU's back-end program conventions name the port as --netdev
// does: --socket-path=PATH is vhost-user,path=PATH, --fd=N a passed socket; only one of
// the three, and never stdio.
func TestVhostConventions(t *testing.T) {
	o, err := parseFlags([]string{"--tap", "tap0", "--socket-path", "/tmp/x.sock", "--ctl-socket", ""}, io.Discard)
	if err != nil || o.netdev.Backend != netdev.BackendVhostUser || o.netdev.Local.Path != "/tmp/x.sock" {
		t.Fatalf("--socket-path: %+v, %v", o, err)
	}
	o, err = parseFlags([]string{"--tap", "tap0", "--fd", "3", "--ctl-socket", ""}, io.Discard)
	if err != nil || o.netdev.Local.Type != netdev.AddrFD || o.netdev.Local.FD != 3 || o.netdev.String() != "vhost-user,fd=3" {
		t.Fatalf("--fd 3: %+v, %v", o, err)
	}
	if p := sandboxPlan(o); len(p.RemoveDirs) != 0 {
		t.Errorf("--fd: the sandbox keeps %v to remove sockets from; tapgro bound none", p.RemoveDirs)
	}
	for _, bad := range [][]string{
		{"--socket-path", "/tmp/x.sock", "--netdev", "vhost-user,path=/tmp/y.sock"},
		{"--socket-path", "/tmp/x.sock", "--fd", "3"},
		{"--fd", "1"},
		{},
	} {
		if _, err := parseFlags(append([]string{"--tap", "tap0"}, bad...), io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
