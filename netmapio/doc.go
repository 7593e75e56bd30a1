// Package netmapio connects tapgro to netmap ports (-netdev netmap: a VALE switch, a NIC
// in netmap mode, a netmap pipe). It is the only package that touches memory the kernel
// shares with another party: the netmap region is mapped from /dev/netmap and written by
// the kernel on behalf of other ports, so everything in it is untrusted input. Package
// netdev decides when to register a port (Open) and hands it out as a port.Port.
//
// # Theory of operation
//
// Open (spec netmap,ifname=NAME[,vnet-hdr=0|10|12]; ParseName decodes NAME) opens
// /dev/netmap, registers the port with the API v14 request (NIOCCTRL, NETMAP_REQ_REGISTER, all NIC rings of
// the name — or its host rings with "^", both with "*" — and NR_NO_TX_POLL, since it
// syncs TX itself), maps the region and walks netmap_if → rings → slots → buffers
// (netmap sys/net/netmap.h, sys/net/netmap_user.h). On a VALE port it then sets the
// virtio-net header length with NETMAP_REQ_PORT_HDR_SET (the port must exist first, so this
// comes after registering; NR_ACCEPT_VNET_HDR lets a persistent port that already has a
// header register at all), reads it back, and discards whatever arrived before with the old
// length. Between VALE ports of equal header length frames cross untouched, so with
// vnet-hdr=12 (what QEMU uses once the guest acks VERSION_1 or MRG_RXBUF) 64 KB GSO frames
// pass both ways unsegmented; Accepts() is then CSUM|TSO4|TSO6|TSO_ECN|UFO (UFO by QEMU's
// rule; no USO: QEMU's netmap backend never offers it and VALE cannot segment it). Without
// /dev/netmap Open fails with ErrNoNetmap: the module is out-of-tree and must be loaded.
//
// Reads run one NIOCRXSYNC per batch (none when Pending), copy every complete packet out
// and hand the slots back (head = cur) at the next sync. A packet longer than a buffer
// (2048 bytes by default) spans consecutive slots, all but the last flagged NS_MOREFRAG,
// at most 64 (NETMAP_MAX_FRAGS); a chain cut at tail is not released — head stays at its
// first slot, cur runs ahead to tail — until the rest arrives. Writes copy each frame
// into as many TX slots as it needs, header whole in the first, and publish head = cur
// once per batch before one NIOCTXSYNC; a frame that does not fit whole waits (cur =
// tail, then poll), so the peer never sees part of one. Only TX ring 0 is used, keeping
// frames in order. The /dev/netmap descriptor sits in the Go netpoller (netmap's poll
// registers its wait queues unconditionally on Linux, so epoll works; it is added only
// after registration, before which poll registers nothing). Every access to the shared
// region happens inside a RawConn callback, which holds the descriptor open, so Close
// can unmap safely once the file is closed.
//
// The region is written by the kernel on behalf of another process and is not trusted.
// All access to it is in netmap_unsafe.go: ring offsets, slot counts, buffer sizes and
// buf_ofs are checked against the mapping when the port opens; every buf_idx and len is
// checked on use. A bad RX slot drops its packet (NetmapStats.BadSlot), a chain longer
// than 64 slots or filling the whole ring is dropped (BadChain), an out-of-range or
// backwards tail, or a TX slot whose buffer lies outside the region, ends the port with a
// *RingError (BadRing), and the endpoint (package netdev) registers afresh. The ring
// logic (netmap_ring.go) is OS-independent and is tested against an in-process model of
// the kernel's memory layout and sync behaviour; it has not been run against a real
// netmap module here.
//
// A frame is port.MinFrame to port.MaxFrame bytes plus the header; WriteBatch refuses
// anything else with a *port.FrameError, and an RX frame outside the range is dropped
// and counted (ShortFrame, LongFrame).
//
// # What this package does not do
//
// It does not log, use more than one netmap TX ring, or use netmap's zero-copy buffer
// swapping (frames are copied in and out of the rings). It never segments or checksums
// frames; the pipelines do that before WriteBatch.
package netmapio
