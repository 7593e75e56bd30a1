// Package datapath is tapgro's engine: it moves frames between one TAP (opened with
// IFF_VNET_HDR) and whichever peer is connected, in both directions, and does in
// userspace what the two ends cannot do for each other.
//
// # Theory of operation
//
// Two pipelines, each one goroutine that owns its buffers, so nothing on the packet path
// takes a lock or allocates in steady state:
//
//	TAP ──ReadBatch──► decode vnet hdr ──► pass whole / split GSO / complete csum ──► rxpool ──► port
//	TAP ◄──write────── GRO (package coalescer) ◄── validate the peer's vnet hdr ◄── port.ReadBatch
//
// The TAP→port goroutine lives as long as the TAP; while no peer is connected it keeps
// reading and counts what it discards, as QEMU discards while its link is down. Every
// frame is decided on its own header: a GSO or partial-checksum frame the port accepts
// goes on whole, one it does not is split or checksummed in software first, and the
// batch is staged in the receive pool and flushed at the end of the TAP read (see
// "TAP→port without a payload copy" below). The port→TAP goroutine lives as long as one
// connection: plain segments from the port go through the GRO engine, frames with a
// vnet header are validated as strictly as the kernel would (vnethdr.ValidatePeer) and
// passed whole where the TAP takes them.
//
// # TAP→port without a payload copy
//
// No payload byte is copied in userspace on the way to the port: the kernel copies it
// into the TAP read buffer and out of it into the socket, and the pipeline only reads it
// once, to checksum it. Every frame is staged as a vector (rxpool.ReserveVec): a few
// bytes built in the record's header slot followed by a view of the read buffer.
//
//	plain frame:  [prefix room][port's vnet header, if any]  [frame in the TAP buffer]
//	GSO segment:  [prefix room][zero vnet header][Eth/IP/TCP|UDP]  [payload slice]
//	shm frame:    [prefix room][vnet header][descriptor]     (the frame is in the ring)
//
// vnethdr.SplitHeaders builds each segment's headers in its slot and sums the L4
// checksum over the slot and then over the payload in place, so the segments are byte
// for byte those of the copying vnethdr.Split. A partial checksum the port cannot take
// is completed in place in the TAP buffer (vnethdr.CompleteChecksum): the buffer is the
// pipeline's own and nothing else reads it, so writing two bytes there is cheaper than
// copying the header out. The port gets the batch as port.Vecs (port.VecSender): one
// writev of [prefix+headers][payload] pairs, 512 records per IOV_MAX, for streams —
// vnet-hdr=on streams included — and sendmmsg with per-message iovecs for datagrams. A
// port without TryWriteVecs (netmap, or one without BatchSender) gets the Vecs copied
// together first (flatSender): there the copy stays. Headers longer than a slot
// (rxpool.HeadCap, only IPv6 with long extension headers) take the copying Split.
//
// Ownership of the read buffers is by the batch: process flushes the pool at its end,
// and Flush returns only with the pool empty (every record written) or with the port
// failed (every record discarded) — including a port that stalls, where the pipeline
// waits inside Flush for writability and the delayed flush, and does not read the TAP
// meanwhile, which is the backpressure anyway. So when process returns nothing points
// into the buffers, and the next ReadBatch may overwrite them (tapToPort.released checks
// rxpool's Borrowing, and drops rather than send a reused buffer's bytes if that ever
// failed; the ring slots of a shared-memory port are handed back only after it,
// slotsDone). The flush at the end of each read batch was already the pipeline's rule,
// so holding buffers for exactly one batch costs no throughput; a pool that owned
// several batches' buffers would only matter if a flush could return with records
// still queued, which it cannot.
//
// # Port→TAP: frames lent in place, or by reference
//
// A port that lends its frames (port.Lender: every stream port) hands the pipeline
// views of its own read buffer, valid until the next read: the GRO engine takes them
// in order through coalescer.Add, copying what it keeps into the aggregate in one pass
// with the checksum check (vnethdr.SumCopy), and writes a frame it does not merge to
// the TAP from where it lies, its vnet header in the headroom in front of it. On a
// QEMU-framed stream that headroom is the previous frame's tail (port.Lender), which
// is why the frames of a batch are taken strictly in order. Between the socket and the
// TAP a payload byte is then copied once in tapgro, into the aggregate.
//
// A plain port that does not lend (datagrams, netmap) reads into a ring of 2×batch read
// buffers, and its frames are offered to the GRO engine by reference (coalescer.AddRef):
// an aggregate of segments of at least groRefMinPayload (4096) bytes holds the head's
// rewritten headers and slices of each segment's payload where the port put it, and
// leaves with one writev(2) of [vnet header + headers][payload]…, so the payload is
// copied only by the kernel.
// MTU-sized segments are still copied into the aggregate: the kernel's gathered copy
// costs per iovec (drivers/net/tun.c tun_get_user → _copy_from_iter sets up one user
// copy per segment), and 46 pieces cost it more than GRO's cache-hot copy of them
// (measured; see groRefMinPayload).
//
// The engine counts its references per buffer. Each read claims the ring's next
// batch of buffers and releases them first (coalescer.Release); an aggregate that still
// points into one copies its payloads then (copy on hold) and stays held. So a buffer
// is never refilled under an aggregate, memory stays fixed, and the timer flush,
// eviction and the flush reasons behave as when everything is copied. With one batch
// of slack an aggregate held across a read (batch flush while the port has more
// buffered, timer flush) normally ends before its buffers come round again. Lent
// frames go in by copy (coalescer.Add): they are the port's again after the batch.
//
// Negotiation decides, from what each side can carry and accept (port.Backend), the TAP's
// read offloads (TUNSETOFFLOAD) and which software steps each direction runs; it runs at
// start, on every new peer, and on every runtime switch (SetGRO, SetUDPGRO, SetOffloads).
// Switches change atomics that the pipelines pick up between two read batches, so no
// frame is lost or reordered. A GSO write the kernel refuses with EINVAL turns that
// offload off for good only if the frame was valid and a probe frame the engine builds
// itself of the same kind is refused too, so a peer cannot switch an offload off.
//
// Serve supervises connections one at a time: it announces the TAP's addresses to each
// new peer (gratuitous ARP, unsolicited neighbour advertisements), runs the port→TAP
// pipeline until the peer leaves, and on shutdown closes the TAP first and lets the
// TAP→port pipeline deliver what it already read.
//
// The engine never logs on the packet path: per-frame outcomes are counters, read only
// through Snapshot, and rare events go to the injected Logger. It imports neither a
// logging library nor a metrics library.
package datapath
