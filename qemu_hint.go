package main

import (
	"context"
	"os/exec"
	"strings"
	"time"

	"tapgro/netdev"
)

// The start-up hint: the QEMU options that meet tapgro's port, passt-style, written for
// the QEMU release in use (--qemu-version, or the qemu-system-x86_64 on the PATH). Two
// things differ between releases: the option that makes a QEMU client reconnect when
// tapgro restarts (-chardev's reconnect=1 became reconnect-ms=1000 in 9.2; -netdev
// stream has one only from 8.0), and vectors=0 on a vhost-user NIC under TCG, which
// QEMU 7.2 needs (netdev.QEMUVersion says why).

// qemuBinary is the QEMU --qemu-version auto looks for on the PATH.
const qemuBinary = "qemu-system-x86_64"

// resolveQEMU is the release the hint is for: --qemu-version, or with auto the version
// the QEMU on the PATH prints (2 s at most; a QEMU that does not answer, or none, leaves
// it unknown and the hint names both spellings).
func resolveQEMU(o *options) netdev.QEMUVersion {
	if !o.qemuAuto {
		return o.qemu
	}
	path, err := exec.LookPath(qemuBinary)
	if err != nil {
		return netdev.QEMUVersion{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return netdev.QEMUVersion{}
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v, err := netdev.ParseQEMUVersion(first)
	if err != nil {
		return netdev.QEMUVersion{}
	}
	return v
}

// forQEMU is "QEMU 10.0" for a known release; for an unknown one, "QEMU" and what older
// releases spell differently (older: the caveat, "" for none).
func forQEMU(v netdev.QEMUVersion, older string) string {
	if v.Known() {
		return "QEMU " + v.String()
	}
	if older == "" {
		return "QEMU"
	}
	return "QEMU (" + older + ")"
}

// qemuHint is the line that tells the user what to give QEMU for a socket-family or
// netmap spec.
func qemuHint(spec netdev.Spec, v netdev.QEMUVersion) string {
	if spec.Backend == netdev.BackendStream && spec.VnetHdr {
		return "vnet-hdr=on: the peer must be another tapgro with vnet-hdr=on (QEMU cannot speak it)"
	}
	if spec.Remote.Type == netdev.AddrFD {
		return "the port is the inherited connection " + spec.Remote.String() + "; its peer is already attached"
	}
	opt := spec.QEMUOptionFor("n0", v)
	if opt == "" {
		return "this port has no QEMU counterpart (a NIC in netmap mode)"
	}
	older := ""
	if spec.Backend == netdev.BackendStream && spec.Role == netdev.RoleServer {
		older = "before 9.2 reconnect=1 for reconnect-ms=1000; 7.2 has neither, and does not reconnect"
	}
	return "give " + forQEMU(v, older) + ": -netdev " + opt + " -device virtio-net-pci,netdev=n0"
}

// vhostUserHint is what QEMU needs to meet a vhost-user spec: guest RAM in a shared
// memfd (the back-end maps it), the chardev that connects (and reconnects) to tapgro,
// or with server=off listens for it, the netdev and the NIC — with vectors=0 for TCG
// where that release needs it.
func vhostUserHint(spec netdev.Spec, v netdev.QEMUVersion) string {
	chardev, nd := spec.QEMUVhostUser("n0", "vu0", v)
	dev := spec.QEMUVhostUserDevice("n0")
	args := "-object memory-backend-memfd,id=mem,size=<RAM>,share=on -machine memory-backend=mem" +
		" -chardev " + chardev + " -netdev " + nd + " -device " + dev
	older := ""
	if spec.Role == netdev.RoleServer {
		older = "before 9.2 the chardev takes reconnect=1 for reconnect-ms=1000"
	}
	tail := " (RAM = the guest's -m size)"
	switch {
	case v.TCGVectors0():
		tail = " (RAM = the guest's -m size; under TCG, not KVM, the NIC needs vectors=0: -device " + dev + ",vectors=0)"
	case !v.Known():
		if older != "" {
			older += "; "
		}
		older += "under TCG before 10.0 the NIC needs vectors=0"
	}
	return "give " + forQEMU(v, older) + ": " + args + tail
}
