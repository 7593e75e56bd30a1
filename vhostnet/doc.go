// Package vhostnet is the datapath between one TAP (tapdev) and one vhost-user-net
// device (vhostuser): QEMU hands over the guest's memory and rings, and frames move
// between the rings and the TAP with one readv(2) or writev(2) per frame, straight
// from and into guest memory. Each queue pair has its own TAP queue.
//
// # Wiring
//
// The TAP is what tap.go's TAP interface says of one queue: *tapdev.Device, or
// tapdev/taptest's in-memory TAP, on which the tests run without root (only those that
// need the kernel's own TAP behaviour, such as its segmentation or several queues, put
// a real one in a namespace).
//
// New(Config{TAP}) probes the TAP's read offloads and builds a vhostuser.Backend whose
// Handler is the Net; Serve(ctx, listener) serves one QEMU at a time (QEMU is the
// client: -chardev socket,path=P,reconnect=1 -netdev vhost-user,chardev=…) and closes,
// counts and logs a second connection that is still waiting after a second's grace,
// rather than leave it blocked in the backlog. Each
// connection is a fresh session; when it ends its rings are stopped, the workers joined
// and guest memory unmapped before the next is served, so a reconnecting QEMU needs
// no saved state (it recovers ring positions from used->idx, QEMU hw/virtio/virtio.c
// virtio_queue_split_restore_last_avail_idx). ServeClient(ctx, path, retry) is the same
// with the socket's roles reversed: QEMU listens (-chardev socket,server=on,wait=off)
// and Net dials it with package redial's backoff, one session at a time, and dials again
// when a session ends.
//
// # Queue pairs
//
// New(Config{TAPs}) takes N queues of one multiqueue TAP (tapdev.OpenQueues) and offers
// N queue pairs (vhostuser adds PROTOCOL_F_MQ, GET_QUEUE_NUM and VIRTIO_NET_F_MQ); QEMU
// keeps one vhost device per pair on the one socket, ring 2·i being pair i's RX and
// 2·i+1 its TX (vhost-user.rst "Multiple queue support"). A pair is a small struct: its
// TAP queue and its counters (Stats.Queues[i]); its two rings' workers read and write
// only that queue, as QEMU's TAP back-end gives each queue pair its own fd. Everything
// else is the Net's and shared: features, header length, offloads, capture, Stats.
// The TAP steers each flow to one queue by flow hash, following the queue the flow was
// last written on (drivers/net/tun.c tun_automq_select_queue, tun_flow_update), so a
// flow stays on one pair and nothing is reordered.
//
// SET_VRING_ENABLE (Handler.VringEnabled, sent whenever the guest changes its number of
// pairs: VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, hw/net/virtio-net.c peer_attach/peer_detach)
// is mapped, for a pair's RX ring, onto TUNSETQUEUE: a disabled pair's queue is detached
// so the kernel steers it nothing and purges what it held (drivers/net/tun.c
// __tun_detach), and attached again on enable — what QEMU's own TAP back-end does
// (net/tap-linux.c tap_fd_enable/tap_fd_disable). Between sessions, and at New, queue 0
// is attached and the others detached: rings start disabled (vhost-user.rst "Ring
// states") and QEMU enables the pairs the guest uses. With one pair the TAP is a
// single-queue device and nothing is detached. The queue fds are also where the
// device-wide settings go: TUNSETVNETHDRSZ (tun->vnet_hdr_sz) is issued on every queue
// so that each tapdev.Device records the length, TUNSETOFFLOAD (set_offload on tun->dev)
// once on queue 0; a detached queue's fd still takes both.
//
// # Features and the TAP
//
// Offer lists VERSION_1, MRG_RXBUF, EVENT_IDX, INDIRECT_DESC; CSUM and HOST_TSO4/6/ECN
// (the TAP accepts partial checksums and TCP GSO on write whatever TUNSETOFFLOAD says,
// drivers/net/tun.c tun_get_user → virtio_net_hdr_to_skb), HOST_USO where the TAP took
// TUN_F_USO4/6 in the probe (Linux 6.2 and later, whose virtio_net_hdr_to_skb also
// takes UDP_L4 GSO on write); and GUEST_CSUM/TSO4/TSO6/ECN/USO4/USO6 as far as the TAP
// probed them (offloads.go). At SET_FEATURES (Handler.FeaturesAcked) Net takes its
// lock exclusively — every ring batch holds it shared — and sets TUNSETVNETHDRSZ to the
// guest's header length (12 with VERSION_1 or MRG_RXBUF, else 10), which makes the TAP's
// header byte for byte the guest's, and TUNSETOFFLOAD to what the guest can receive:
// CSUM only with GUEST_CSUM, TSO4/TSO6/TSO_ECN only with GUEST_TSO4/TSO6/ECN (virtio
// spec "Processing of Incoming Packets"), within what the TAP probed and the cap
// (--offload; SetOffloads, `tapgro ctl offload`, changes it under a running session).
// USO is the exception: it is set for every guest that takes partial checksums, and
// UDP GSO frames of an IP version whose GUEST_USO bit the guest did not ack are cut
// here (split.go says why that beats the kernel cutting them). Guest offload changes
// over the control queue never reach a vhost-user back-end in QEMU 7.2 or 10.0
// (net/vhost-user.c has no set_offload), so the acked set holds until the next
// SET_FEATURES. Neither QEMU passes the USO bits to a vhost-user back-end: 10.0's
// virtio_net_get_features clears them unless the peer has_uso, which net/vhost-user.c
// does not implement; the in-process front-end double negotiates them.
//
// # Transmit (guest → TAP)
//
// One goroutine per TX ring, writing its pair's TAP queue: Wait for a kick, Begin, then up to 64 chains: Pop, gather
// the header by byte offset into a private copy (the driver may split it across
// descriptors and start the frame inside the header's descriptor: virtio spec "Message
// Framing"; the guest may also rewrite its memory while we look), and if the kernel
// would act on it (NEEDS_CSUM or GSO) check that the guest acked that kind (CSUM,
// HOST_*) and run vnethdr.ValidatePeer — the kernel's own rules, stricter — over a
// private copy of the frame's first 512 bytes, falling back to a full copy only if the
// headers do not fit. A refused frame is counted by reason and never reaches the TAP.
// The validated header, re-encoded (its hdr_len re-derived, num_buffers 0; hdr_len 0
// for a frame with neither GSO nor NEEDS_CSUM, where tun reads nothing else of it),
// is the first segment of one TryWritev, the copied prefix the second, and the rest of
// the frame in guest memory the others (cloud-hypervisor's process_tx writes chains to
// its TAP the same way): so the headers the kernel parses are the bytes that were
// checked, whatever the guest writes meanwhile. Every chain gets a used entry of
// length 0; End publishes them with one used->idx store and at most one call. If the
// TAP's send buffer is full (rare: tun's sndbuf is INT_MAX by default) the chain is
// rewound, the batch ended and the worker waits for the TAP outside any batch, so the
// control plane never waits on the kernel. A GSO frame the TAP refuses with EINVAL goes
// by package gsowrite's policy, the one every tapgro datapath follows (fallback.go): it
// is sent as plain segments cut from tapgro's copy, and its kind is cut before every
// later write — GRO stopped too, for TCP — only if tapgro's own probe of the kind is
// refused as well. A started but disabled ring has its chains
// completed and discarded (vhost-user.rst "Ring states").
//
// Under bulk the worker holds rather than waits (--tx-hold, 150 µs by default; tx.go):
// after a batch that emptied the ring and moved 16 KiB or more, it sleeps for the hold
// with kicks still off, then takes what the guest posted meanwhile in one batch, so a
// guest that posts a frame at a time costs one wake-up per hold, not one per frame, and
// saves the kick (a VM exit) too. A smaller batch — a request, an ACK, the end of a
// burst — waits for the kick as before, so request/response traffic is never held. The
// hold sleeps on a timerfd (hold.go): the runtime's own timers round a sub-millisecond
// sleep up to 1 ms in an idle process.
//
// # Receive (TAP → guest)
//
// One goroutine per RX ring, reading its pair's TAP queue: Begin; then up to
// 64 frames: reserve for the worst case (header + 65593 with MRG_RXBUF, the largest
// frame tun_put_user produces; one chain without), TryReadv the TAP straight into the
// reserved segments, commit with the length read (it writes num_buffers and keeps the
// chains the frame did not take for the next frame, so an ACK into 4 KiB buffers walks
// one chain, not the 17 its reservation covered); End (which hands back what no frame
// took, one used->idx store, at most one call). The batch ends when
// the TAP is empty (then the worker waits for the TAP to become readable, outside the
// batch: the control plane must never wait for a packet), when the budget is spent, or
// when the ring cannot cover the worst case: then the next frame is read into the
// worker's own buffer and only its real length reserved (QEMU reads into its own
// buffer first too), so a few small buffers still take small frames. A frame that does
// not fit stays there; the worker stops reading the TAP — the kernel's queue holds up
// to txqueuelen frames and drops the rest — counts a stall, and sleeps in
// Vring.WaitMore until the guest posts more buffers and kicks. Readv's private
// sink byte tells a frame that overflowed a chain (dropped, counted) from one that
// fitted exactly. Each header read is judged against the acks (rxJudge): a kind the
// guest takes passes whole; a GSO frame it cannot take — UDP GSO for a guest without
// GUEST_USO4/6, or a TCP GSO frame queued before a SET_FEATURES narrowed the mask — is
// copied out of the chains into private memory, the chains go back to the ring, and
// the frame is cut into plain, checksummed frames, each put into chains of its own
// (split.go); anything else outside the acks is counted and dropped. DATA_VALID is
// cleared for a guest without GUEST_CSUM.
//
// # GRO toward the TAP (gro.go)
//
// With Config.GRO (--gro on; SetGRO switches it at run time, taken up by each TX worker
// at its next batch after it wrote what it held), a guest that sends MTU-sized TCP segments — it did not ack
// HOST_TSO4/6, or switched TSO off inside, which never reaches a vhost-user back-end —
// has them coalesced by package coalescer, the stream path's engine with its rules and
// tapgro_gro_* counters (Stats.GRO), so the host stack gets 64 KB TCP GSO packets,
// which tun always accepts on write (drivers/net/tun.c tun_get_user →
// virtio_net_hdr_to_skb). Zero copy is kept for every frame the engine does not merge:
// after the header checks above, the frame's first 512 bytes are gathered into private
// memory and Coalescer.Classify decides from them. A merge candidate is copied whole
// (once, into the engine's aggregate; the chain is completed at once); anything else —
// the guest's own GSO frames, ACKs, non-TCP — has its flow's held aggregate written
// first and is then written from guest memory as before, so a flow's frames never
// overtake each other. Aggregates are flushed before End at the end of each TX batch
// (--gro-flush batch); with --gro-flush timer, a batch that ended on its budget (more
// chains wait) keeps what is younger than --rsc-interval for the next batch to extend,
// and a batch after which the worker will wait (ring empty, TAP full) flushes
// everything: nothing is ever held while the worker sleeps, and what is held when the
// ring stops is written before the worker ends. The engine's header is 12 bytes whatever the
// session's; each packet's header is re-encoded for the TAP's length in effect. UDP is
// coalesced too with --udp-gro (SetUDPGRO at run time) where the TAP takes UDP_L4 on
// write (it probed USO), by the stream path's rules.
//
// # RSC toward the guest (rsc.go)
//
// When the TAP hands MTU frames although the guest acked GUEST_TSO4/6 — --offload caps
// TUNSETOFFLOAD (Config.Offload; off sets it to 0), or the TAP probed no TSO — and GRO
// is on, the RX worker reads the TAP into private memory instead of the guest's chains
// and runs the frames through a second engine (Stats.RSC, tapgro_vhost_rsc_*), whose
// packets — NEEDS_CSUM with TCPV4/TCPV6 (|ECN only with GUEST_ECN; GUEST_CSUM is
// required for any of them: virtio spec "Feature bit requirements") — are copied into
// reserved chains and committed: QEMU's own virtio-net RSC does the same inside the
// device (hw/net/virtio-net.c virtio_net_rsc_receive). Frames of an IP version whose
// GUEST_TSO bit was not acked bypass the engine, so no GSO type the guest did not ack
// is ever produced (virtio spec "Processing of Incoming Packets"). Aggregates are
// flushed at the end of each TAP read batch (the TAP empty or 64 frames read; the
// timer flush does not apply here). A packet that finds the ring without room is
// stashed, with every packet after it (one Add emits at most two), the worker stops
// reading the TAP and waits for the guest's buffers, then delivers the stash and the
// held aggregates one at a time (FlushOne): nothing is lost or reordered. With TSO on
// the TAP — the usual case — the zero-copy readv path above is unchanged.
//
// # Stopping
//
// GET_VRING_BASE or the end of the session stops the ring inside vhostuser (waking Wait
// and failing Begin); RingStopped then wakes a worker parked on the TAP by setting a
// past deadline, joins it, and clears the deadline. Nothing touches guest memory after
// RingStopped returns.
//
// # Live migration (migrate.go)
//
// vhostuser marks the pages a migration must copy again (its log.go); what the device
// adds: bytes written into chains handed back unused are reported (Queue.Wrote), a
// receive ring asked to stop (RingStopping, before GET_VRING_BASE) first delivers the
// frame it holds, the rest of a cut frame and RSC's packets, and SEND_RARP puts QEMU's
// own announcement, a RARP from the guest's MAC, into the TAP. GUEST_ANNOUNCE is offered,
// so a guest that acks it announces itself instead.
//
// # Faults
//
// Guest memory can vanish under a worker (the front-end truncates the file behind it).
// Each worker runs with debug.SetPanicOnFault and defers vhostuser.Vring.Guard, and
// each batch is a function that holds Net's read lock by defer, so the panic releases
// it on the way out; Guard releases the ring, counts the fault and ends the session,
// which is logged once with the region that faulted. What the TX engine held is
// discarded, not flushed: a copy the fault cut short may be in it. The kernel's own
// copies (readv/writev from guest memory) fail with EFAULT instead and count as TAP
// errors.
//
// # MTU
//
// MTU is offered with PROTOCOL_F_NET_MTU, so a NIC with host_mtu=N makes QEMU send
// NET_SET_MTU (hw/net/virtio-net.c virtio_net_vhost_status → vhost_net_set_mtu). It is
// always accepted (a refusal fails vhost_net_start and leaves the guest a dead NIC);
// one that differs from the TAP's MTU is logged.
//
// # Capture
//
// SetCapture (--pcap-port, `tapgro ctl pcap port=FILE`) records each frame as the guest
// sent or received it, GSO frames whole, header left out: TX after the TAP took it, RX
// after the TAP filled the chains and before they are published, straight from guest
// memory (pcapio.Writer.WriteFrameV). Off, it costs one atomic load per frame.
//
// # Counters
//
// Stats: frames, bytes and GSO frames per direction (GSO: frames passed whole; a TX frame
// the GRO engine took counts as a frame when taken), GSO frames cut for the guest
// (their segments count as frames), the two engines' counters (GRO, RSC), RX chains
// used, drops by reason,
// RX stalls, TX blocks, linearized frames, feature changes, and two flags the health
// monitor watches: RXWaiting (frames wait in the TAP for guest buffers) and TXWaiting
// (a frame waits for the TAP), each true while any pair's worker waits. Queues[i]:
// pair i's frames and bytes each way and whether its TAP queue is attached. Kicks and
// calls are vhostuser.Stats (BackendStats).
// State is what `tapgro ctl status` shows: connected, acked features, TAP offloads.
//
// # Limits
//
// Health is judged over all pairs together (a stalled pair next to a busy one is not
// seen). No UFO, and no UDP coalescing toward the guest (RSC is TCP only). Toward the
// TAP, a guest frame
// whose TCP/IP headers extend past 512 bytes (IPv6 extension headers) is copied to be
// classified; toward the guest, RSC mode copies every frame once more than the
// zero-copy path. A chain set of more than 1023
// segments for one RX frame breaks the ring (only a guest posting tiny buffers could);
// a TX chain of more segments than one writev takes is copied.
package vhostnet
