// Package vhostuser is a vhost-user back-end core: QEMU (the front-end) hands the
// back-end the guest's memory and virtqueues over a UNIX socket, and the device behind
// it (vhostnet, for tapgro's network device) moves data through those rings without
// QEMU in the data path. The protocol is QEMU docs/interop/vhost-user.rst as shipped
// with QEMU 7.2; the rings are the virtio 1.x split virtqueue (virtio spec "Split
// Virtqueues"). The package knows no device: which rings the device writes, the header
// every chain starts with and the device's feature bits come from Config (Writable,
// HeaderLen, Features), and what a chain means is the device's business — vhostnet
// reserves receive chains for a frame and fills in its header, as passt's vu_common.c
// does beside its device-agnostic virtio.c.
//
// # Layers
//
// The wire format's names and layouts (header flags, request codes, protocol feature
// bits, payload structs) are package vuproto's, shared with the front-end double
// vhostusertest. proto.go frames messages: a 12-byte header {request, flags, size} read
// with recvmsg(2) (fds ride on the first byte as one SCM_RIGHTS message, received with
// MSG_CMSG_CLOEXEC; MSG_CTRUNC is fatal), then exactly size bytes, bounded by QEMU's own
// VhostUserPayload size. Each known request has an exact size and fd count. Replies carry
// flags 0x5, the request's type and the exact size QEMU checks (hw/virtio/vhost-user.c
// vhost_user_read_header). Every fd is either handed to its owner or closed.
//
// backend.go is the session: one goroutine per connection reads a message, handles it,
// replies. Malformed framing ends the session (the stream can no longer be trusted to be
// in step); a request that is well formed but cannot be honoured (an mmap failure, a bad
// ring size) is answered with a non-zero REPLY_ACK and the session goes on; an unknown
// request is drained, counted, reported and, if it asked, answered with 1. The owner hears
// of it through Handler: FeaturesAcked (with the header length Config.HeaderLen gives),
// RingStarted, RingStopping, RingStopped, VringEnabled (every SET_VRING_ENABLE, running
// ring or not), SetMTU, Unknown, SessionEnded.
//
// mem.go and mem_unsafe.go hold guest memory. Each SET_MEM_TABLE region's fd must be a
// regular file on tmpfs or hugetlbfs (a memfd is one: fstatfs, where a page fault
// always finishes; Config.AnyFSMemory allows DAX or pmem files) that holds the whole
// region, checked with fstat (a mapping past a file's end faults at the first touch);
// a memfd that is not sealed against shrinking is reported. What a session maps, guest
// RAM and dirty log together, is capped (Config.MaxMapped, DefaultMaxMapped). The region is mmapped once from fd offset 0
// (mmap offsets must be page-aligned, mmap_offset need not be), left out of core dumps
// (MADV_DONTDUMP), and its fd closed. Ring addresses are front-end virtual addresses,
// descriptor addresses are guest-physical; both are translated by range checks that
// cannot overflow, into slices of the mapping, so ordinary Go bounds checks guard every
// later access. A buffer that
// crosses two regions becomes two slices. mem_unsafe.go is the only file that uses
// package unsafe (32-bit atomics on ring words, 16-bit event words, alignment) or mmap.
//
// The virtqueue: vring.go is its state and life cycle (configuration from SET_VRING_*,
// start, violations, stop); batch.go the worker's batch, Pop, Push and Rewind;
// notify.go publishing and calls, with moderation; wait.go sleeping for kicks and the
// poll window; fds.go the kick, call and err eventfds (SET_VRING_KICK/CALL/ERR);
// layout.go the seam to the memory format and split.go the split one: translation
// (the descriptor table, avail ring and used ring each for its full size, event words
// included), the descriptor walk with every index and address checked, used entries,
// the index stores and the driver's suppression hints. A ring runs from
// SET_VRING_KICK to GET_VRING_BASE (vhost-user.rst "Ring states"). The device sees a
// ring only as a Queue (queue.go): chains (Pop), used entries (Push), hand-backs
// (Rewind), batches and waits, never ring indices. Vring is that Queue whatever the
// layout: it holds the per-ring state (fds, batch and lock discipline, moderation, the
// poll window, the dirty log's records, faults) over a layout (layout.go), of which
// split.go is the split one and the only one offered today; a packed one
// (VIRTIO_F_RING_PACKED) is one more layout that Vring picks at start, and neither the
// session nor the device changes.
//
// # Concurrency and unmapping
//
// The session goroutine reads the socket with deadlines: a new connection must speak
// within handshakeTimeout, a message begun must be complete and a reply read within
// msgTimeout, so a silent or half-speaking peer cannot hold the socket's one session.
//
// Each Vring has one mutex. The data-path worker holds it from Begin to End (a batch);
// the session takes it to change the ring, to stop it, or to swap guest memory. So a new
// SET_MEM_TABLE is: map the new table, then for each ring lock, point at the new table,
// re-translate, unlock; then unmap the old table. No batch can straddle the swap, and
// nothing can touch a mapping after munmap. The price is that the control plane waits
// for a batch to end, so batches must not block (wait for the TAP to be readable before
// Begin, not inside a batch). iovecs returned by Pop are valid only until End.
//
// # Ordering
//
// The guest writes avail and descriptors and reads used concurrently with us. All
// indices are loaded and stored as the 32-bit word {flags, idx} with sync/atomic, whose
// operations are sequentially consistent: loading avail->idx before the ring entries is
// the read barrier, storing used->idx after the entries is the write barrier, and the
// store followed by a load of the avail word is the full barrier before reading
// used_event or NO_INTERRUPT and before the last look at avail->idx before sleeping
// (QEMU hw/virtio/virtio.c virtqueue_num_heads, virtqueue_split_flush,
// virtio_split_should_notify, virtio_queue_split_set_notification). Descriptors are
// read once into locals and never re-read, since the guest may change them meanwhile.
//
// # Kicks
//
// A worker sleeps in Vring.Wait on the kick eventfd as a non-blocking os.File in the
// Go runtime poller (epoll, edge-triggered), so the goroutine parks instead of a
// thread, with no epoll loop of our own to keep; stopping or replacing the kick closes
// the File, which wakes the sleeper. The kick's counter is never read: each eventfd
// write is an edge of its own, which is how Linux vhost waits on it too (Vring.sleep),
// and it saves two system calls per sleep. One worker per ring (or per pair) matches
// cloud-hypervisor and passt.
// Kick, call and err must be eventfds (fds.go: anything else ends the session, since a
// pipe can fill and a file never stops being readable); call and err are made
// non-blocking, so a full counter drops a signal (counted). The front-end shares the
// open file and can make it blocking again, so every write to its eventfds (calls,
// errors, and Poke's write to the kick) follows signal.go: an ordinary system call the
// scheduler accounts for, made after the ring's lock is released (on its own goroutine
// when the session decides it), one in flight per fd, unjammed at close, and a write
// asleep for over a second ends the session (JamError), found by the session's
// once-a-second look between messages. A kick that wakes the worker with no work
// 65536 times in a row stops the ring (RejectKick). A ring with no kick fd (NOFD_MASK) is polled, 50 µs after work and
// backing off to 50 ms while idle.
//
// Kicks are off while a worker runs and on only while it sleeps: Wait and WaitMore
// enable them (avail_event = the index they wait for, or NO_NOTIFY cleared), issue a
// full barrier and look at avail->idx once more before sleeping, and nothing else turns
// them on, so a driver posting to a ring whose worker is awake does not kick it (Linux
// vhost keeps them off the same way until handle_tx finds the ring empty). Poke, from
// another goroutine, has the worker watch avail->idx with kicks off for the time
// SetPollWindow gives before it enables them and sleeps (wait.go).
//
// # Faults
//
// fault.go: a front-end can still shrink the file after SET_MEM_TABLE. Every goroutine
// that touches guest memory runs with debug.SetPanicOnFault; workers defer Vring.Guard,
// the session and the moderation timer recover where they hold the lock. A fault in
// guest RAM or the dirty log breaks the ring (RejectFault) and ends the session with a
// FaultError that names which; the next one is served. A fault at any other address is
// tapgro's own bug and is not recovered.
//
// # Publishing and notification
//
// Push writes used entries straight into the used ring slots past used->idx (the
// driver does not look at them until idx moves, so the ring itself is the shadow); End
// stores used->idx once per batch and decides on at most one call: with EVENT_IDX by
// vring_need_event from the used idx at the previous decision, unconditionally the first
// time after a start; without it unless avail->flags has NO_INTERRUPT. End leaves
// avail_event alone (see Kicks); without EVENT_IDX the ring sets NO_NOTIFY while work
// remains and clears it before sleeping. Publish does the same mid-batch, for
// callers that signal every frame (the baseline moderation is measured against).
//
// Vring.SetCallModeration bounds a ring's calls under load to one per interval. Load is
// moderateBytes pushed since the last call, counting what the device moved the other
// way (Vring.NoteLoad: vhostnet's TX worker reports its bytes to the pair's RX ring, so
// the ACKs of a guest's upload are moderated with it); below it every call goes at
// once, so request/response traffic pays no latency. A call due sooner is owed to a timer
// (time.AfterFunc, armed once per owed call), which asks the driver again when it fires:
// a driver that consumed everything by polling meanwhile has moved used_event past the
// published index, and needs none. A batch that found the avail ring empty sends an
// owed call at once on a ring the device writes (the driver posts buffers only after
// processing; on a ring the device reads, empty only means caught up), and a ring stop
// sends it before the front-end takes over. Half a ring published without a call goes
// at once whatever the interval: a driver refills or reclaims only what it was told of.
// A call sent for any reason stops the timer of the one it carries, so an idle process
// is not woken for nothing. A device whose unit spans several chains
// (a frame over mergeable buffers) must not Publish between them: End and Publish are
// the only publishes.
//
// # Dirty logging (live migration)
//
// log.go: VHOST_F_LOG_ALL and PROTOCOL_F_LOG_SHMFD are always offered. SET_LOG_BASE
// maps QEMU's bitmap (checked and mapped like guest memory, swapped under every ring's
// lock like a new memory table); logging applies to a ring while LOG_ALL is acked and
// its SET_VRING_ADDR carries VHOST_VRING_F_LOG, both of which QEMU sends to running
// rings as a migration starts and ends (a running ring's address may change only in
// those two fields). While logging, Pop records each writable chain's descriptors as
// guest-physical ranges, and Push (bytes used) and Wrote (bytes written into a chain
// handed back) mark the pages of those bytes; every used-ring store marks its page at
// log_guest_addr. Bits are set with atomic ORs, and a page past the bitmap is counted,
// not marked. Pop's records live for one batch (at most maxLogPieces kept; a chain past
// that is marked whole), so a guest cannot grow them, and a head popped twice has two.
// GET_VRING_BASE first tells the device (Handler.RingStopping), so it can
// hand the guest what it holds before the ring stops, and SEND_RARP (PROTOCOL_F_RARP,
// Config.RARP) is the device's to answer. While logging is off the data path pays one
// pointer test per chain and per used-ring store.
//
// # Hostile guests
//
// Every chain is walked with bounded work: head and next < table size, at most
// table-size descriptors (loop), no zero-length or wrongly directed descriptors,
// indirect tables only when negotiated, on the head, len%16 == 0, len/16 ≤ num, never
// nested, never with NEXT; every address must be inside a region; lengths must not
// overflow; the chain must hold the device's header; avail->idx may not run more than
// num ahead of the used index last published (which also bounds what the back-end
// holds in flight to the ring size), nor move back behind the last index seen. A violation is counted by Reason in
// Stats.Rejected, written to the err eventfd, and stops the ring until the front-end
// restarts it (QEMU virtio_error behaves alike). Nothing panics and nothing outside the
// mapped regions is touched.
package vhostuser
