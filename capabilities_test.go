package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPrintCapabilities: QEMU's back-end program convention (docs/interop/vhost-user.rst
// "Backend program conventions"): --print-capabilities prints the JSON object, type net,
// exits 0 and ignores every other argument, even ones that would fail.
func TestPrintCapabilities(t *testing.T) {
	for _, args := range [][]string{
		{"--print-capabilities"},
		{"--tap", "x", "--no-such-flag", "--print-capabilities"},
		{"-print-capabilities", "--netdev", "bogus"},
	} {
		var out, errOut bytes.Buffer
		if code := realMain(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d (%s)", args, code, errOut.String())
		}
		var caps map[string]any
		if err := json.Unmarshal(out.Bytes(), &caps); err != nil || caps["type"] != "net" || len(caps) != 1 {
			t.Errorf("%v: printed %q (%v), want {\"type\": \"net\"}", args, out.String(), err)
		}
	}
}

// vhostUserBackendTypes is VHostUserBackendType from QEMU's docs/interop/vhost-user.json.
var vhostUserBackendTypes = []string{"9p", "balloon", "block", "caif", "console", "crypto", "gpu",
	"input", "net", "rng", "rpmsg", "rproc-serial", "scsi", "vsock", "fs"}

// TestVhostUserDescriptor: contrib/qemu/50-tapgro.json is a VhostUserBackend as QEMU's
// docs/interop/vhost-user.json defines it (description, type, binary, optional tags,
// nothing else), of type net, naming the installed binary, and it is what a package
// installs under /usr/share/qemu/vhost-user/ (the convention's directory).
func TestVhostUserDescriptor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("contrib", "qemu", "50-tapgro.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Description string   `json:"description"`
		Type        string   `json:"type"`
		Binary      string   `json:"binary"`
		Tags        []string `json:"tags"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("not a VhostUserBackend: %v", err)
	}
	if d.Description == "" || d.Type != "net" || !slices.Contains(vhostUserBackendTypes, d.Type) ||
		!filepath.IsAbs(d.Binary) || strings.Contains(d.Binary, "..") {
		t.Errorf("descriptor %+v: want a description, type net and an absolute binary path", d)
	}
	for _, tag := range d.Tags {
		if tag == "" {
			t.Error("an empty tag")
		}
	}
}
