package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// Flags of the operations side: security defaults, privilege drop, log file, health.
func TestParseFlagsOps(t *testing.T) {
	const unixND = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/t.sock"
	good := []struct {
		name  string
		args  []string
		check func(*testing.T, *options)
	}{
		{"defaults", []string{"--tap", "t0", unixND}, func(t *testing.T, o *options) {
			if o.socketMode != 0o600 || o.socketGroup != 0 || o.user != nil || o.logFile != "" || o.healthStall != 10*time.Second {
				t.Errorf("defaults: mode %o group %d user %v log %q stall %v", o.socketMode, o.socketGroup, o.user, o.logFile, o.healthStall)
			}
		}},
		{"socket mode and group", []string{"--tap", "t0", unixND, "--socket-mode", "0660", "--socket-group", "65534"}, func(t *testing.T, o *options) {
			if o.socketMode != 0o660 || o.socketGroup != 65534 {
				t.Errorf("mode %o group %d", o.socketMode, o.socketGroup)
			}
		}},
		{"user nobody", []string{"--tap", "t0", unixND, "--user", "nobody"}, func(t *testing.T, o *options) {
			if o.user == nil || o.user.uid != 65534 || o.user.name != "nobody" {
				t.Errorf("user %v", o.user)
			}
		}},
		{"numeric user with group", []string{"--tap", "t0", unixND, "--user", "4242", "--group", "4243"}, func(t *testing.T, o *options) {
			if o.user == nil || o.user.uid != 4242 || o.user.gid != 4243 {
				t.Errorf("user %v", o.user)
			}
		}},
		{"loopback tcp listen", []string{"--tap", "t0", "--netdev", "socket,listen=127.0.0.1:5000"}, nil},
		{"localhost stream listen", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=localhost,addr.port=5000"}, nil},
		{"remote listen allowed", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5000", "--allow-remote"}, nil},
		{"remote dial needs nothing", []string{"--tap", "t0", "--netdev", "socket,connect=198.18.0.9:5000"}, nil},
		{"inherited fd", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=fd,addr.str=3"}, nil},
		{"log file", []string{"--tap", "t0", unixND, "--log-file", "/tmp/x.log", "--health-stall", "3s"}, func(t *testing.T, o *options) {
			if o.logFile != "/tmp/x.log" || o.healthStall != 3*time.Second {
				t.Errorf("log %q stall %v", o.logFile, o.healthStall)
			}
		}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
	bad := []struct {
		args []string
		msg  string
	}{
		{[]string{"--tap", "t0", "--netdev", "socket,listen=198.18.0.1:5000"}, "not a loopback address; add --allow-remote"},
		{[]string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5000"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=::,addr.port=5000"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "dgram,local.type=inet,local.host=198.18.0.1,local.port=1,remote.type=inet,remote.host=198.18.0.2,remote.port=2"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "socket,udp=198.18.0.2:2,localaddr=198.18.0.1:1"}, "not a loopback address"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "0400"}, "owner read-write"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "0777"}, "no execute bits"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "rw"}, "octal"},
		{[]string{"--tap", "t0", unixND, "--socket-group", "no-such-group-xyz"}, "--socket-group"},
		{[]string{"--tap", "t0", unixND, "--user", "no-such-user-xyz"}, "--user"},
		{[]string{"--tap", "t0", unixND, "--user", "root"}, "nothing to drop"},
		{[]string{"--tap", "t0", unixND, "--group", "nogroup"}, "--group needs --user"},
		{[]string{"--tap", "t0", unixND, "--user", "4242"}, "add --group"},
		{[]string{"--tap", "t0", unixND, "--health-stall", "10ms"}, "at least 1s"},
		{[]string{"--tap", "t0", "--netdev", "stream,addr.type=fd,addr.str=2"}, "file descriptor number >= 3"},
	}
	for _, tc := range bad {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.msg)
		}
	}
}

func TestLogFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.log")
	o := &options{logFile: path, logLevel: logrus.InfoLevel, logFormat: "text"}
	hupReopeners = reopeners{}
	out, err := logOutput(o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	log := newLogger(o, out)
	log.Info("first")
	if err := os.Rename(path, path+".1"); err != nil { // what logrotate does
		t.Fatal(err)
	}
	log.Info("second, still to the moved file")
	hupReopeners.reopenAll(log)
	log.Info("third")
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if !strings.Contains(string(old), "first") || !strings.Contains(string(old), "second") || strings.Contains(string(old), "third") {
		t.Errorf("rotated file:\n%s", old)
	}
	if !strings.Contains(string(cur), "SIGHUP: reopened") || !strings.Contains(string(cur), "third") {
		t.Errorf("new file:\n%s", cur)
	}
}
