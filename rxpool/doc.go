// Package rxpool is the receive-buffer pool of the TAP→port direction: every frame for
// the peer (a guest's QEMU port) is staged — copied into preallocated buffers, or, for
// most frames, described as a vector of a header slot and memory the caller lends (see
// Vectors) — and delivered in batches, one system call for many frames, with
// backpressure instead of loss when the peer falls behind.
//
// # Buffers
//
// A Pool is one slab of Count × BufSize bytes (default 2048 × 2048 B = 4 MiB) allocated
// by New, and nothing else is allocated afterwards. As with virtio-net's mergeable
// receive buffers (VIRTIO_NET_F_MRG_RXBUF), a frame larger than one buffer spans several
// consecutive ones: NumBuffers(n) = ceil(n / BufSize) is what virtio would report in
// num_buffers (a 65549-byte frame over 2048-byte buffers spans 33). Unlike virtio, the
// buffers of one frame are always adjacent, so a frame is one contiguous slice and one
// iovec: a frame that would run past the slab's end skips the remaining buffers there
// (they are freed together with that frame and counted in SkippedBuffers). Frames are
// kept in a ring of descriptors and are staged, delivered and freed strictly in order;
// nothing is ever reordered or duplicated.
//
// Staging is Reserve (room for up to maxLen bytes, or false when the pool is full),
// writing into the returned slice, and Commit(n). Several reservations may be open at
// once; Cancel abandons them. Staged returns the committed frames in order, Release(k)
// frees the first k.
//
// # Vectors: frames the pool does not copy
//
// Most frames are not copied at all. A vector (ReserveVec, CommitVec) is a few header
// bytes the caller builds in the descriptor's own header slot (HeadSlot bytes per
// descriptor, beside the ring) followed by a body the caller lends: a segment's
// headers and then its payload where the TAP read put it (vnethdr.SplitHeaders), or a
// port's vnet header and then a whole frame. Staged hands every frame to the port as a
// port.Vec — [headroom + header slot][body], an iovec pair, the headroom being where
// the stream port writes its length prefix — and a copy is simply a Vec whose body is
// in the ring. A vector takes no ring buffer but counts for the buffers its frame would
// span had it been copied (InUse), so what the pool stages, when it is full and what
// it refuses as too big are exactly what they are for copies: the bound on queued
// bytes and frames, and every flush decision, do not depend on whether a frame was
// copied.
//
// Lent memory is the caller's to keep unchanged until the pool lets go of it:
// Borrowing is true while any committed vector's body is lent. Flush returns only with
// the pool empty (or the port failed, and Discard then empties it), so a caller that
// flushes before reusing its read buffers — the TAP→port pipeline does, at the end of
// every TAP read batch — never overwrites bytes still queued, stall or delayed flush
// included: while the port is full the pipeline waits inside Flush and does not read
// the TAP.
//
// # Delivery and backpressure
//
// Flush hands every staged frame to a Sender (port.VecSender: many length-prefixed
// records per writev on streams, sendmmsg on datagrams) and returns only
// when the pool is empty or the port failed. In the unconstrained steady state the
// caller flushes at the end of each TAP read batch and when the pool is full, and no
// delay applies. When the port answers ErrWouldBlock the pool's goroutine waits in the
// port's netpoller until the socket is writable again — and so stops reading the TAP,
// whose kernel queue then holds or drops like a real NIC's while TCP backs off. Memory
// stays at the slab; nothing spins.
//
// # The delayed flush
//
// After a stall, writability alone does not trigger the flush (QEMU's hw/net/spapr_llan.c
// h_add_logical_lan_buffer: adding receive buffers re-arms a 500 µs timer instead of
// flushing at once). The pool waits until the port's free send-buffer room reaches a
// threshold (default: room for everything queued, at most half the buffer) or FlushDelay
// has passed since writability returned, whichever is first, and then sends everything in
// one go, so a slow consumer gets a few large writes rather than many that each find the
// socket full again. Room is polled every FlushDelay/8 only during that window; an idle or
// unconstrained pool arms no timer at all. The clock is injectable (Config.Clock) so tests
// are deterministic.
//
// # Limits
//
// The pool holds at most Count buffers: a frame (or the segments of one GSO frame)
// needing more than the whole pool can never be staged, and the caller drops it under
// DropTooBig. Memory is the slab plus Count × HeadSlot bytes of header slots (384 KiB
// by default). When the port fails, staged frames are discarded under DropPortError.
//
// A Pool belongs to one goroutine; only Stats (atomics) may be read concurrently. The
// package never logs.
package rxpool
