package netdev

import (
	"strings"
	"tapgro/sockport"
	"testing"
)

func TestParseSpecGood(t *testing.T) {
	tests := []struct {
		in   string
		want Spec
		str  string // canonical form
		qemu string // QEMUOption("n0")
	}{
		{
			in:   "stream,server=on,addr.type=unix,addr.path=/run/gro.sock",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "unix", Path: "/run/gro.sock"}},
			str:  "stream,server=on,addr.type=unix,addr.path=/run/gro.sock",
			qemu: "stream,id=n0,server=off,addr.type=unix,addr.path=/run/gro.sock",
		},
		{
			in:   "stream,id=x,addr.type=unix,addr.path=/run/q.sock",
			want: Spec{Backend: BackendStream, Role: RoleClient, Remote: Addr{Type: "unix", Path: "/run/q.sock"}},
			str:  "stream,server=off,addr.type=unix,addr.path=/run/q.sock",
			qemu: "stream,id=n0,server=on,addr.type=unix,addr.path=/run/q.sock",
		},
		{
			in:   "stream,server=off,addr.type=inet,addr.host=127.0.0.1,addr.port=5555,vnet-hdr=off",
			want: Spec{Backend: BackendStream, Role: RoleClient, Remote: Addr{Type: "inet", Host: "127.0.0.1", Port: 5555}},
			str:  "stream,server=off,addr.type=inet,addr.host=127.0.0.1,addr.port=5555",
			qemu: "stream,id=n0,server=on,addr.type=inet,addr.host=127.0.0.1,addr.port=5555",
		},
		{
			in:   "stream,server=yes,addr.type=inet,addr.host=::1,addr.port=5555,vnet-hdr=on",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "inet", Host: "::1", Port: 5555}, VnetHdr: true},
			str:  "stream,server=on,addr.type=inet,addr.host=::1,addr.port=5555,vnet-hdr=on",
			qemu: "stream,id=n0,server=off,addr.type=inet,addr.host=::1,addr.port=5555",
		},
		{
			in:   "stream,server=on,addr.type=unix,addr.path=/p,vnet-hdr=on,shm=off",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "unix", Path: "/p"}, VnetHdr: true, NoShm: true},
			str:  "stream,server=on,addr.type=unix,addr.path=/p,vnet-hdr=on,shm=off",
			qemu: "stream,id=n0,server=off,addr.type=unix,addr.path=/p",
		},
		{
			in:   "stream,server=on,addr.type=unix,addr.path=/p,vnet-hdr=on,shm=on",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "unix", Path: "/p"}, VnetHdr: true},
			str:  "stream,server=on,addr.type=unix,addr.path=/p,vnet-hdr=on",
			qemu: "stream,id=n0,server=off,addr.type=unix,addr.path=/p",
		},
		{
			in:   "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5555",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "inet", Host: "0.0.0.0", Port: 5555}},
			str:  "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5555",
			qemu: "stream,id=n0,server=off,addr.type=inet,addr.host=127.0.0.1,addr.port=5555",
		},
		{
			in:   "stream,server=on,addr.type=unix,addr.path=/tmp/a,,b",
			want: Spec{Backend: BackendStream, Role: RoleServer, Local: Addr{Type: "unix", Path: "/tmp/a,b"}},
			str:  "stream,server=on,addr.type=unix,addr.path=/tmp/a,,b",
			qemu: "stream,id=n0,server=off,addr.type=unix,addr.path=/tmp/a,,b",
		},
		{
			in:   "socket,listen=127.0.0.1:5555",
			want: Spec{Backend: BackendSocket, Role: RoleServer, Local: Addr{Type: "inet", Host: "127.0.0.1", Port: 5555}},
			str:  "socket,listen=127.0.0.1:5555",
			qemu: "socket,id=n0,connect=127.0.0.1:5555",
		},
		{
			in:   "socket,id=n1,listen=:5555",
			want: Spec{Backend: BackendSocket, Role: RoleServer, Local: Addr{Type: "inet", Host: "127.0.0.1", Port: 5555}},
			str:  "socket,listen=127.0.0.1:5555",
			qemu: "socket,id=n0,connect=127.0.0.1:5555",
		},
		{
			in:   "socket,connect=localhost:5555",
			want: Spec{Backend: BackendSocket, Role: RoleClient, Remote: Addr{Type: "inet", Host: "localhost", Port: 5555}},
			str:  "socket,connect=localhost:5555",
			qemu: "socket,id=n0,listen=localhost:5555",
		},
		{
			in:   "socket,udp=127.0.0.1:6000,localaddr=127.0.0.1:6001",
			want: Spec{Backend: BackendSocket, Role: RoleDatagram, Remote: Addr{Type: "inet", Host: "127.0.0.1", Port: 6000}, Local: Addr{Type: "inet", Host: "127.0.0.1", Port: 6001}},
			str:  "socket,udp=127.0.0.1:6000,localaddr=127.0.0.1:6001",
			qemu: "socket,id=n0,udp=127.0.0.1:6001,localaddr=127.0.0.1:6000",
		},
		{
			in: "dgram,local.type=inet,local.host=127.0.0.1,local.port=6000,remote.type=inet,remote.host=127.0.0.1,remote.port=6001",
			want: Spec{Backend: BackendDgram, Role: RoleDatagram,
				Local: Addr{Type: "inet", Host: "127.0.0.1", Port: 6000}, Remote: Addr{Type: "inet", Host: "127.0.0.1", Port: 6001}},
			str:  "dgram,local.type=inet,local.host=127.0.0.1,local.port=6000,remote.type=inet,remote.host=127.0.0.1,remote.port=6001",
			qemu: "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=6001,remote.type=inet,remote.host=127.0.0.1,remote.port=6000",
		},
		{
			in: "dgram,remote.type=unix,remote.path=/run/qemu.dg,local.type=unix,local.path=/run/gro.dg",
			want: Spec{Backend: BackendDgram, Role: RoleDatagram,
				Local: Addr{Type: "unix", Path: "/run/gro.dg"}, Remote: Addr{Type: "unix", Path: "/run/qemu.dg"}},
			str:  "dgram,local.type=unix,local.path=/run/gro.dg,remote.type=unix,remote.path=/run/qemu.dg",
			qemu: "dgram,id=n0,local.type=unix,local.path=/run/qemu.dg,remote.type=unix,remote.path=/run/gro.dg",
		},
		{
			in:   "vhost-user,path=/run/vu.sock",
			want: Spec{Backend: BackendVhostUser, Role: RoleServer, Local: Addr{Type: "unix", Path: "/run/vu.sock"}},
			str:  "vhost-user,path=/run/vu.sock",
			qemu: "", // QEMUVhostUser
		},
		{
			in:   "vhost-user,id=v,server=on,path=/tmp/a,,b",
			want: Spec{Backend: BackendVhostUser, Role: RoleServer, Local: Addr{Type: "unix", Path: "/tmp/a,b"}},
			str:  "vhost-user,path=/tmp/a,,b",
			qemu: "", // QEMUVhostUser
		},
		{
			in:   "vhost-user,server=off,path=/run/qemu/vu.sock",
			want: Spec{Backend: BackendVhostUser, Role: RoleClient, Remote: Addr{Type: "unix", Path: "/run/qemu/vu.sock"}},
			str:  "vhost-user,path=/run/qemu/vu.sock,server=off",
			qemu: "", // QEMUVhostUser
		},
		{
			in:   "vhost-user,queues=4,path=/run/vu.sock",
			want: Spec{Backend: BackendVhostUser, Role: RoleServer, Local: Addr{Type: "unix", Path: "/run/vu.sock"}, Queues: 4},
			str:  "vhost-user,path=/run/vu.sock,queues=4",
			qemu: "", // QEMUVhostUser
		},
		{
			in:   "vhost-user,path=/run/vu.sock,server=off,queues=1",
			want: Spec{Backend: BackendVhostUser, Role: RoleClient, Remote: Addr{Type: "unix", Path: "/run/vu.sock"}},
			str:  "vhost-user,path=/run/vu.sock,server=off",
			qemu: "", // QEMUVhostUser
		},
		{
			in:   "vhost-user,path=/tmp/a,,b,server=no,id=x",
			want: Spec{Backend: BackendVhostUser, Role: RoleClient, Remote: Addr{Type: "unix", Path: "/tmp/a,b"}},
			str:  "vhost-user,path=/tmp/a,,b,server=off",
			qemu: "", // QEMUVhostUser
		},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if err != nil {
				t.Fatalf("ParseSpec: %v", err)
			}
			if got != tt.want {
				t.Errorf("ParseSpec =\n %+v\nwant\n %+v", got, tt.want)
			}
			if s := got.String(); s != tt.str {
				t.Errorf("String = %q, want %q", s, tt.str)
			}
			if q := got.QEMUOption("n0"); q != tt.qemu {
				t.Errorf("QEMUOption = %q, want %q", q, tt.qemu)
			}
			again, err := ParseSpec(got.String())
			if err != nil || again != got {
				t.Errorf("ParseSpec(String()) = %+v, %v; want %+v", again, err, got)
			}
		})
	}
}

func TestQEMUVhostUser(t *testing.T) {
	sp, err := ParseSpec("vhost-user,path=/run/a,,b.sock")
	if err != nil {
		t.Fatal(err)
	}
	c, n := sp.QEMUVhostUser("n0", "vu0", QEMUVersion{7, 2})
	if want := "socket,id=vu0,path=/run/a,,b.sock,reconnect=1"; c != want {
		t.Errorf("QEMUVhostUser chardev = %q, want %q", c, want)
	}
	if want := "vhost-user,id=n0,chardev=vu0"; n != want {
		t.Errorf("QEMUVhostUser netdev = %q, want %q", n, want)
	}
	if _, err := Open(sp, Events{}); err == nil || !strings.Contains(err.Error(), "vhostnet") {
		t.Errorf("Open(vhost-user) = %v, want an error pointing at vhostnet", err)
	}
	// server=off: QEMU listens on the path and tapgro dials it.
	cl, err := ParseSpec("vhost-user,path=/run/a,,b.sock,server=off")
	if err != nil {
		t.Fatal(err)
	}
	c, n = cl.QEMUVhostUser("n0", "vu0", QEMUVersion{})
	if want := "socket,id=vu0,path=/run/a,,b.sock,server=on,wait=off"; c != want {
		t.Errorf("QEMUVhostUser chardev (server=off) = %q, want %q", c, want)
	}
	if want := "vhost-user,id=n0,chardev=vu0"; n != want {
		t.Errorf("QEMUVhostUser netdev (server=off) = %q, want %q", n, want)
	}
	if _, err := Open(cl, Events{}); err == nil || !strings.Contains(err.Error(), "vhostnet") {
		t.Errorf("Open(vhost-user,server=off) = %v, want an error pointing at vhostnet", err)
	}
	if d := cl.QEMUVhostUserDevice("n0"); d != "virtio-net-pci,netdev=n0" {
		t.Errorf("QEMUVhostUserDevice = %q", d)
	}
	// queues=N: QEMU's netdev says the same and the NIC gets mq=on.
	mq, err := ParseSpec("vhost-user,path=/run/vu.sock,queues=2")
	if err != nil {
		t.Fatal(err)
	}
	if _, n := mq.QEMUVhostUser("n0", "vu0", QEMUVersion{}); n != "vhost-user,id=n0,chardev=vu0,queues=2" {
		t.Errorf("QEMUVhostUser netdev (queues=2) = %q", n)
	}
	if d := mq.QEMUVhostUserDevice("n0"); d != "virtio-net-pci,netdev=n0,mq=on" {
		t.Errorf("QEMUVhostUserDevice (queues=2) = %q", d)
	}
	if mq.QueuePairs() != 2 || cl.QueuePairs() != 1 {
		t.Errorf("QueuePairs %d, %d; want 2, 1", mq.QueuePairs(), cl.QueuePairs())
	}
	st, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=/p")
	if c, n := st.QEMUVhostUser("n0", "vu0", QEMUVersion{}); c != "" || n != "" {
		t.Errorf("QEMUVhostUser for stream = %q, %q; want empty", c, n)
	}
	if d := st.QEMUVhostUserDevice("n0"); d != "" {
		t.Errorf("QEMUVhostUserDevice for stream = %q; want empty", d)
	}
}

func TestParseSpecBad(t *testing.T) {
	long := "/" + strings.Repeat("x", sockport.MaxUnixPath)
	tests := []struct {
		in      string
		wantErr string // substring
	}{
		{"", "empty spec"},
		{"tap,ifname=x", `unknown backend "tap"`},
		{"stream,adr.type=unix", `unknown key "adr.type" for stream`},
		{"stream,server=on,addr.type=unix,addr.path=/p,reconnect=2", `unknown key "reconnect" for stream`},
		{"stream,server", `"server" is not key=value`},
		{"stream,server=maybe,addr.type=unix,addr.path=/p", `bad value "maybe" for key "server"`},
		{"stream,vnet-hdr=2,addr.type=unix,addr.path=/p", `bad value "2" for key "vnet-hdr"`},
		{"stream,shm=off,addr.type=unix,addr.path=/p", `shm=off needs vnet-hdr=on`},
		{"stream,vnet-hdr=on,shm=x,addr.type=unix,addr.path=/p", `bad value "x" for key "shm"`},
		{"stream,server=on", `needs key "addr.type"`},
		{"stream,addr.type=fd,addr.str=1", `want a file descriptor number >= 3`},
		{"stream,addr.type=fd", `addr.type=fd needs key "addr.str"`},
		{"stream,addr.type=vsock", `bad value "vsock" for key "addr.type"`},
		{"stream,addr.type=unix", `needs key "addr.path"`},
		{"stream,addr.type=unix,addr.path=", `bad value "" for key "addr.path"`},
		{"stream,addr.type=unix,addr.path=" + long, `key "addr.path": path is 108 bytes`},
		{"stream,addr.type=unix,addr.path=/p,addr.port=1", `key "addr.port" does not go with addr.type=unix`},
		{"stream,addr.type=inet,addr.port=1", `needs key "addr.host"`},
		{"stream,addr.type=inet,addr.host=h", `needs key "addr.port"`},
		{"stream,addr.type=inet,addr.host=h,addr.port=70000", `bad value "70000" for key "addr.port"`},
		{"stream,addr.type=inet,addr.host=h,addr.port=0", `bad value "0" for key "addr.port"`},
		{"stream,addr.type=inet,addr.host=h,addr.port=x", `bad value "x" for key "addr.port"`},
		{"stream,addr.type=inet,addr.host=,addr.port=1", `bad value "" for key "addr.host"`},
		{"stream,addr.type=inet,addr.host=h,addr.port=1,addr.path=/p", `key "addr.path" does not go with addr.type=inet`},
		{"stream,server=on,server=off,addr.type=unix,addr.path=/p", `key "server" given twice`},
		{"socket", "needs one of listen=, connect=, udp= or fd="},
		{"socket,listen=:1,connect=h:1", "only one of"},
		{"socket,mcast=230.0.0.1:1234", `unknown key "mcast" for socket`},
		{"socket,fd=-3", `want a file descriptor number >= 3`},
		{"socket,listen=5555", `bad value "5555" for key "listen"`},
		{"socket,connect=:5555", `bad value ":5555" for key "connect": host is required`},
		{"socket,connect=h:0", `bad value "0" for key "connect"`},
		{"socket,listen=[::1]:5555", "IPv4 only"},
		{"socket,listen=:1,localaddr=:2", `"localaddr" only goes with udp=`},
		{"socket,udp=127.0.0.1:1", `needs key "localaddr"`},
		{"socket,udp=127.0.0.1:1,localaddr=x", `bad value "x" for key "localaddr"`},
		{"dgram,local.type=inet,local.host=h,local.port=1", `needs key "remote.type"`},
		{"dgram,remote.type=inet,remote.host=h,remote.port=1", `needs key "local.type"`},
		{"dgram,local.type=inet,local.host=h,local.port=1,remote.type=unix,remote.path=/p", "differ"},
		{"dgram,local.type=fd,local.str=3", `unknown key "local.str" for dgram`},
		{"dgram,local.type=inet,local.host=h,local.port=1,remote.type=inet,remote.host=230.0.0.1,remote.port=1", "multicast"},
		{"dgram,local.type=inet,local.host=h,local.port=1,remote.type=inet,remote.host=h,remote.port=0", `bad value "0" for key "remote.port"`},
		{"vhost-user", `vhost-user needs key "path"`},
		{"vhost-user,path=", `bad value "" for key "path"`},
		{"vhost-user,path=" + long, `key "path": path is 108 bytes`},
		{"vhost-user,server=off", `vhost-user needs key "path"`},
		{"vhost-user,path=,server=off", `bad value "" for key "path"`},
		{"vhost-user,path=/p,server=x", `bad value "x" for key "server"`},
		{"vhost-user,path=/p,chardev=c", `unknown key "chardev" for vhost-user`},
		{"vhost-user,path=/p,queues=0", "vhost-user queues=0: want a number of queue pairs, 1..128"},
		{"vhost-user,path=/p,queues=129", "queues=129"},
		{"vhost-user,path=/p,queues=two", "queues=two"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if err == nil {
				t.Fatalf("ParseSpec(%q) = %+v, want error containing %q", tt.in, got, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "netdev: ") {
				t.Errorf("error %q does not start with \"netdev: \"", err)
			}
		})
	}
}

// TestQEMUVersions: the hint's options follow the QEMU release: the chardev's and the
// stream client's reconnect option and vectors=0 under TCG.
func TestQEMUVersions(t *testing.T) {
	vu, _ := ParseSpec("vhost-user,path=/run/vu.sock")
	st, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=/p")
	cl, _ := ParseSpec("stream,server=off,addr.type=unix,addr.path=/p")
	for _, tc := range []struct {
		ver      string
		chardev  string
		stream   string
		vectors0 bool
	}{
		{"7.2", "socket,id=vu0,path=/run/vu.sock,reconnect=1", "stream,id=n0,server=off,addr.type=unix,addr.path=/p", true},
		{"8.0.4", "socket,id=vu0,path=/run/vu.sock,reconnect=1", "stream,id=n0,server=off,addr.type=unix,addr.path=/p,reconnect=1", true},
		{"9.1", "socket,id=vu0,path=/run/vu.sock,reconnect=1", "stream,id=n0,server=off,addr.type=unix,addr.path=/p,reconnect=1", true},
		{"QEMU emulator version 9.2.0", "socket,id=vu0,path=/run/vu.sock,reconnect-ms=1000", "stream,id=n0,server=off,addr.type=unix,addr.path=/p,reconnect-ms=1000", true},
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)", "socket,id=vu0,path=/run/vu.sock,reconnect-ms=1000", "stream,id=n0,server=off,addr.type=unix,addr.path=/p,reconnect-ms=1000", false},
		{"", "socket,id=vu0,path=/run/vu.sock,reconnect-ms=1000", "stream,id=n0,server=off,addr.type=unix,addr.path=/p,reconnect-ms=1000", false},
	} {
		var v QEMUVersion
		if tc.ver != "" {
			var err error
			if v, err = ParseQEMUVersion(tc.ver); err != nil {
				t.Fatal(err)
			}
		}
		if c, _ := vu.QEMUVhostUser("n0", "vu0", v); c != tc.chardev {
			t.Errorf("%q: chardev %q, want %q", tc.ver, c, tc.chardev)
		}
		if o := st.QEMUOptionFor("n0", v); o != tc.stream {
			t.Errorf("%q: stream %q, want %q", tc.ver, o, tc.stream)
		}
		// QEMU the server: nothing to reconnect on its side.
		if o := cl.QEMUOptionFor("n0", v); o != "stream,id=n0,server=on,addr.type=unix,addr.path=/p" {
			t.Errorf("%q: QEMU as stream server %q", tc.ver, o)
		}
		if v.TCGVectors0() != tc.vectors0 {
			t.Errorf("%q: TCGVectors0 %v", tc.ver, !tc.vectors0)
		}
	}
	for _, bad := range []string{"seven", "1.0", "x.y"} {
		if _, err := ParseQEMUVersion(bad); err == nil {
			t.Errorf("ParseQEMUVersion(%q) accepted", bad)
		}
	}
}
