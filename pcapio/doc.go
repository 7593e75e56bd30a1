// Package pcapio writes classic pcap files of Ethernet frames for tapgro's capture
// (--pcap-tap, --pcap-port, `tapgro ctl pcap`).
//
// Format: the classic libpcap file format with nanosecond timestamps (magic 0xa1b23c4d,
// version 2.4, written little-endian; every reader detects the byte order from the
// magic), LINKTYPE_ETHERNET (1). Each record is a 16-byte header (seconds, nanoseconds,
// captured length, original length) and the frame's first caplen bytes. Frames are
// recorded with their true length: a TAP-side GSO super-frame of up to 64 KB is one
// record of that size (the default snap length, 262144, is Wireshark's own maximum for
// Ethernet, so nothing is cut). The virtio_net_hdr in front of a frame is not part of an
// Ethernet capture and is never written, so a super-frame's gso_size and checksum
// offsets are not in the file; Wireshark shows such a frame as one long packet with
// (correctly) unfilled TCP/UDP checksums when the sender left them to the offload.
//
// Data flow: WriteFrame copies the record header from a preallocated scratch array and
// the frame into a bufio.Writer (256 KiB), all under one mutex, so it allocates nothing
// and the datapath goroutines that call it (one per direction and side) may share a
// Writer. A background goroutine flushes the buffer every FlushInterval (1 s) so a
// capture being watched (tail -f | tcpdump -r -) lags by at most that. Capture is a
// debugging feature: the mutex and a write(2) into the page cache when the buffer fills
// are the whole cost, and a frame never waits for more than one such write or, at the
// size cap, one rotation (renames and an open).
//
// Limits: with MaxBytes set, the file is rotated before a record would take it past
// MaxBytes: PATH becomes PATH.1, PATH.1 becomes PATH.2 … up to PATH.Files, the oldest
// is overwritten; with Files = 0 capture stops at the cap instead (frames counted as
// dropped). A single record larger than MaxBytes still goes into a fresh file whole.
// Reopen (SIGHUP) rotates in place when PATH is still the open file (so the operator
// gets a complete PATH.1 to read), or starts a new PATH when logrotate moved it away.
//
// Point is a capture point switched at run time (`tapgro ctl pcap`): the live Writer
// behind one atomic pointer, nil while off, with counters that outlive each file. The
// engine has two (TAP side, port side); the vhost-user datapath one. WriteFrameV takes a
// frame spread over segments (guest memory, after its virtio-net header) without
// gathering it first.
//
// Failures never reach the datapath: the first write, flush or rotation error disables
// the Writer (Err reports it), and every later frame is counted in Stats.Dropped. A
// Reopen clears the failure and tries again. The package never logs.
package pcapio
