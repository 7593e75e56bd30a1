//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/kvlog"
	"tapgro/quietlog"
	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// protocolFeaturesMask is feature bit 30, which in GET_FEATURES announces that
// GET/SET_PROTOCOL_FEATURES exist (vhost-user.rst "Protocol features").
const protocolFeaturesMask = uint64(1) << virtio.VhostUserProtocolFeatures

// Config says what a Backend offers: the device behind it decides everything that is
// not the protocol's or the ring's (which rings carry what, the header every chain
// starts with, the device's own feature bits).
type Config struct {
	// Features are the offered virtio feature bits (bit 30 is added). Only split
	// rings: do not offer RING_PACKED or IOMMU_PLATFORM.
	Features uint64
	// Rings is how many virtqueues a session has, 1..256 (SET_VRING_KICK/CALL/ERR
	// carry an 8-bit index).
	Rings int
	// QueueNum is what GET_QUEUE_NUM answers; above 1 PROTOCOL_F_MQ is offered. The
	// device decides its unit (QEMU's net client counts queue pairs, net/vhost-user.c).
	QueueNum int
	// Writable says whether the device writes ring i's chains (true: every descriptor
	// must be device-writable) or reads them (every descriptor read-only). nil: reads.
	Writable func(ring int) bool
	// HeaderLen is the header every chain must hold, for the acked features (a
	// shorter chain breaks the ring); nil: none.
	HeaderLen func(acked uint64) int
	// NetMTU offers PROTOCOL_F_NET_MTU (NET_SET_MTU → Handler.SetMTU).
	NetMTU bool
	// RARP, if set, offers PROTOCOL_F_RARP: after a migration QEMU sends SEND_RARP with
	// the guest's MAC, for the device to announce where the guest now is (a net device
	// puts a RARP from that MAC on its link). An error answers the request with a
	// failure.
	RARP    func(mac [6]byte) error
	Handler Handler
	Stats   *Stats // nil: the Backend allocates one
	// MaxMapped caps the bytes a session maps, guest RAM and dirty log together (0:
	// DefaultMaxMapped); a SET_MEM_TABLE or SET_LOG_BASE past it is refused.
	MaxMapped uint64
	// AnyFSMemory accepts guest RAM and logs on files outside tmpfs and hugetlbfs (DAX,
	// pmem), whose page faults may sleep (mem.go checkRegionFile).
	AnyFSMemory bool
	// Log gets warnings of what a session accepted but the operator should know (guest
	// memory that can be truncated under us, a kick fd that never goes quiet); nil:
	// kvlog.Nop. What ends a session is its error, returned by Serve.
	Log kvlog.Logger
}

// Backend serves vhost-user sessions, one at a time per socket.
type Backend struct {
	cfg   Config
	stats *Stats
	mem   memPolicy
	gate  quietlog.Gate // Config.Log's lines are a front-end's doing (warn)
}

// warn writes a warning to Config.Log, keeping a front-end that repeats what causes it
// (a table of unsealed memfds, a ring that keeps breaking) from flooding the log. The
// gate's key is quietlog.Key of the message and its values, so the same event at
// another index or count shares a key, as when the values were printed into the line.
// A warning let through after others were held back counts them under "left_out".
func (b *Backend) warn(msg string, kv ...any) {
	ok, held := b.gate.Pass(quietlog.Key(fmt.Sprintln(append([]any{msg}, kv...)...)))
	if !ok {
		return
	}
	if held > 0 {
		kv = append(kv, "left_out", held)
	}
	b.cfg.Log.Warn(msg, kv...)
}

// NewBackend checks cfg.
func NewBackend(cfg Config) (*Backend, error) {
	if cfg.Rings < 1 || cfg.Rings > 256 {
		return nil, fmt.Errorf("vhostuser: %d rings, want 1..256", cfg.Rings)
	}
	cfg.QueueNum = max(cfg.QueueNum, 1)
	if cfg.Writable == nil {
		cfg.Writable = func(int) bool { return false }
	}
	if cfg.HeaderLen == nil {
		cfg.HeaderLen = func(uint64) int { return 0 }
	}
	if cfg.Handler == nil {
		cfg.Handler = NopHandler{}
	}
	if cfg.Log == nil {
		cfg.Log = kvlog.Nop{}
	}
	// Dirty logging (log.go) is the core's, whatever the device: VHOST_F_LOG_ALL with
	// PROTOCOL_F_LOG_SHMFD is what QEMU needs before it migrates a guest at all (without
	// it hw/virtio/vhost.c vhost_dev_init installs a migration blocker).
	cfg.Features |= protocolFeaturesMask | 1<<virtio.LogAll
	b := &Backend{cfg: cfg, stats: cfg.Stats, mem: memPolicy{maxBytes: cfg.MaxMapped, anyFS: cfg.AnyFSMemory}}
	if b.mem.maxBytes == 0 {
		b.mem.maxBytes = DefaultMaxMapped
	}
	if b.stats == nil {
		b.stats = new(Stats)
	}
	return b, nil
}

// Stats returns the counters.
func (b *Backend) Stats() *Stats { return b.stats }

// protocolFeatures is what GET_PROTOCOL_FEATURES offers: REPLY_ACK always (so QEMU gets
// an answer to SET_MEM_TABLE instead of a GET_FEATURES round trip), LOG_SHMFD always
// (the dirty log QEMU migrates with, log.go), MQ with more than one pair, NET_MTU and
// RARP if configured. Nothing that needs features not implemented here.
func (b *Backend) protocolFeatures() uint64 {
	p := uint64(1)<<vuproto.ProtoReplyAck | 1<<vuproto.ProtoLogShmfd
	if b.cfg.RARP != nil {
		p |= 1 << vuproto.ProtoRARP
	}
	if b.cfg.QueueNum > 1 {
		p |= 1 << vuproto.ProtoMQ
	}
	if b.cfg.NetMTU {
		p |= 1 << vuproto.ProtoNetMTU
	}
	return p
}

// Session is one connection's state.
type Session struct {
	b     *Backend
	c     *conn
	h     Handler
	stats *Stats

	features   uint64
	featuresOK bool
	protocol   uint64
	hdrLen     int
	mem        *guestMem
	rings      []*Vring
	msg        message
	// Dirty logging: LOG_ALL in the acked features, and the log SET_LOG_BASE mapped.
	logAll bool
	log    *dirtyLog

	// abortErr is why another goroutine ended the session (Session.abort).
	abortMu  sync.Mutex
	abortErr error

	onSpoke func() // ServeSpoke's
}

// Serve runs one session on uc until the front-end disconnects or breaks the protocol.
// It returns nil on a clean close. Every ring is stopped, every mapping unmapped and
// every fd closed before it returns; uc is closed too. A connection that sends nothing
// within handshakeTimeout, or leaves a message or a reply half done for msgTimeout,
// ends with an error.
func (b *Backend) Serve(uc *net.UnixConn) error { return b.ServeSpoke(uc, nil) }

// ServeSpoke is Serve, calling spoke (if not nil) when the front-end's first message
// has arrived: a caller that serves one session at a time can tell a silent connection
// from a session.
func (b *Backend) ServeSpoke(uc *net.UnixConn, onSpoke func()) error {
	c, err := newConn(uc)
	if err != nil {
		uc.Close()
		return err
	}
	s := &Session{b: b, c: c, h: b.cfg.Handler, stats: b.stats, hdrLen: b.cfg.HeaderLen(0), onSpoke: onSpoke}
	for i := range s.msg.fds {
		s.msg.fds[i] = -1
	}
	s.rings = make([]*Vring, b.cfg.Rings)
	for i := range s.rings {
		s.rings[i] = newVring(i, b.cfg.Writable(i), b.stats)
		s.rings[i].onFault = s.abort
		s.rings[i].warn = b.warn
	}
	spoke, err := s.loop()
	s.teardown()
	if spoke {
		s.stats.Ended.Add(1)
	}
	uc.Close()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	s.abortMu.Lock()
	if s.abortErr != nil {
		err = s.abortErr
	}
	s.abortMu.Unlock()
	s.h.SessionEnded(err)
	return err
}

// abort ends the session from another goroutine (a worker whose guest memory
// faulted): the first error is kept for Serve to return, and shutdown(2) makes the
// session's recvmsg see end of file. Later messages are not read: after a fault the
// guest's memory cannot be trusted to be what the front-end described.
func (s *Session) abort(err error) {
	s.abortMu.Lock()
	defer s.abortMu.Unlock()
	if s.abortErr != nil {
		return
	}
	s.abortErr = err
	s.c.raw.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
}

// handshakeTimeout is how long a new connection may stay silent. A front-end speaks
// first and at once (QEMU sends GET_FEATURES as its chardev opens, net/vhost-user.c
// vhost_user_start), so a silent peer is one that would hold the socket's only session
// and keep every real front-end out.
const handshakeTimeout = 5 * time.Second

// watchEvery is how often a session that has spoken checks, between messages, for a
// write asleep on one of its front-end's eventfds (signal.go): one timer a second per
// connected front-end, the price of ending a session whose front-end blocked its own
// eventfd without anyone else noticing.
const watchEvery = time.Second

// loop serves messages until the connection ends; spoke says whether the front-end sent
// any (and so counted as a session).
func (s *Session) loop() (spoke bool, err error) {
	wait := handshakeTimeout
	for {
		m := &s.msg
		s.c.uc.SetReadDeadline(time.Now().Add(wait))
		err := s.c.readMsg(m)
		if err == errIdle {
			if !spoke {
				return spoke, protoErr("no message within %v of connecting", handshakeTimeout)
			}
			if err := s.checkJams(); err != nil {
				return spoke, err
			}
			continue
		}
		if err != nil {
			return spoke, err
		}
		if !spoke {
			// A session is a front-end that spoke: a connection closed before its first
			// message (a listening QEMU's backlog emptied as it exits) is not one.
			s.stats.Sessions.Add(1)
			spoke = true
			wait = watchEvery
			if s.onSpoke != nil {
				s.onSpoke()
			}
		}
		s.stats.Messages[min(m.req, MaxRequest)].Add(1)
		err = s.dispatch(m)
		m.closeFds()
		if err != nil {
			return spoke, err
		}
	}
}

// JamError ends a session whose front-end blocked one of its own eventfds: a write
// to it slept for longer than jamLimit (signal.go).
type JamError struct{ Ring int }

func (e *JamError) Error() string {
	return fmt.Sprintf("vhost-user: a signal to ring %d's eventfd slept for over %v: the front-end "+
		"filled its counter and made it blocking; session ended", e.Ring, jamLimit)
}

// checkJams ends the session if a write to one of its rings' eventfds has slept for
// longer than jamLimit.
func (s *Session) checkJams() error {
	cutoff := monoNow() - int64(jamLimit)
	for _, v := range s.rings {
		v.mu.Lock()
		jammed := v.jammedLocked(cutoff)
		v.mu.Unlock()
		if jammed {
			s.stats.Jammed.Add(1)
			return &JamError{Ring: v.index}
		}
	}
	return nil
}

// requestError is a request that failed but leaves the session usable: it is answered
// with a non-zero u64 when NEED_REPLY is set (vhost-user.rst REPLY_ACK).
type requestError struct{ error }

func reqErr(format string, a ...any) error { return requestError{fmt.Errorf(format, a...)} }

func (s *Session) dispatch(m *message) error {
	p := m.body()
	if sizeRule(m.req) == -2 || !s.negotiated(m.req) {
		return s.unknown(m)
	}
	if err := validate(m.req, p, m.nfds); err != nil {
		return err
	}
	replied, err := s.handle(m, p)
	var re requestError
	if errors.As(err, &re) {
		s.stats.Failed.Add(1)
		if m.needReply() && !replied {
			return s.c.replyU64(m.req, 1)
		}
		return nil
	}
	if err != nil {
		return err
	}
	// REPLY_ACK: a request that has no reply of its own gets {req, 0x5, 8, 0}. A
	// request with a reply body gets only that body (vhost-user.rst REPLY_ACK).
	if m.needReply() && !replied {
		return s.c.replyU64(m.req, 0)
	}
	return nil
}

// negotiated reports whether an optional request was unlocked by what we offered.
// QEMU 7.2 sends these only if offered, so anything else is handled as unknown.
func (s *Session) negotiated(req uint32) bool {
	switch req {
	case ReqGetQueueNum:
		return s.b.protocolFeatures()&(1<<vuproto.ProtoMQ) != 0
	case ReqNetSetMTU:
		return s.b.protocolFeatures()&(1<<vuproto.ProtoNetMTU) != 0
	case ReqSetLogBase:
		// Without LOG_SHMFD the log would be QEMU's private memory: the request then
		// carries a bare address and no fd, and cannot be served.
		return s.protocol&(1<<vuproto.ProtoLogShmfd) != 0
	case ReqSendRARP:
		return s.protocol&(1<<vuproto.ProtoRARP) != 0
	case ReqSetLogFd:
		return false // the log's eventfd: QEMU never sends it to a net device
	}
	return true
}

// unknown: the spec says nothing; DPDK answers 1 if NEED_REPLY. The payload has been
// read whole already (the stream stays in step), its fds are closed by the caller.
func (s *Session) unknown(m *message) error {
	s.stats.Unknown.Add(1)
	s.h.Unknown(m.req, int(m.size))
	if m.needReply() {
		return s.c.replyU64(m.req, 1)
	}
	return nil
}

func (s *Session) ring(idx uint32) (*Vring, error) {
	if int(idx) >= len(s.rings) {
		return nil, protoErr("ring index %d ≥ %d", idx, len(s.rings))
	}
	return s.rings[idx], nil
}

// handle runs one validated request; replied says whether it sent its own reply.
func (s *Session) handle(m *message, p []byte) (replied bool, err error) {
	switch m.req {
	case ReqGetFeatures:
		return true, s.c.replyU64(m.req, s.b.cfg.Features)
	case ReqSetFeatures:
		f, _ := decodeU64(p)
		if f&^s.b.cfg.Features != 0 {
			// Acking what was not offered (DPDK vhost_user_set_features refuses too).
			return false, protoErr("SET_FEATURES %#x not a subset of %#x", f, s.b.cfg.Features)
		}
		s.setFeatures(f)
	case ReqSetOwner, ReqResetOwner:
		// SET_OWNER starts the session: nothing to do. RESET_OWNER is deprecated and
		// QEMU 7.2 never sends it to net back-ends; ignored as libvhost-user does.
	case ReqGetProtocolFeatures:
		return true, s.c.replyU64(m.req, s.b.protocolFeatures())
	case ReqSetProtocolFeatures:
		f, _ := decodeU64(p)
		s.protocol = f & s.b.protocolFeatures()
	case ReqGetQueueNum:
		return true, s.c.replyU64(m.req, uint64(s.b.cfg.QueueNum))
	case ReqSetMemTable:
		return false, s.setMemTable(m, p)
	case ReqSetVringNum, ReqSetVringBase, ReqSetVringEnable, ReqGetVringBase:
		st, _ := decodeState(p)
		v, err := s.ring(st.Index)
		if err != nil {
			return false, err
		}
		return s.vringState(m.req, v, st)
	case ReqSetVringAddr:
		a, _ := decodeAddr(p)
		v, err := s.ring(a.Index)
		if err != nil {
			return false, err
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.state == ringRunning && (a.Desc != v.addr.Desc || a.Used != v.addr.Used || a.Avail != v.addr.Avail) {
			return false, reqErr("SET_VRING_ADDR moves running ring %d", a.Index)
		}
		// On a running ring QEMU changes only the log flag and address: it turns
		// logging on and off this way when a migration starts and ends
		// (hw/virtio/vhost.c vhost_dev_set_log → vhost_virtqueue_set_addr).
		v.addr, v.addrSet = a, true
		v.setLogLocked(s.log, s.logAll)
	case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
		return false, s.vringFile(m, p)
	case ReqSetLogBase:
		return true, s.setLogBase(m, p)
	case ReqSendRARP:
		var mac [6]byte
		copy(mac[:], p) // the MAC is the u64's first 6 bytes (hw/virtio/vhost-user.c vhost_user_migration_done)
		if err := s.b.cfg.RARP(mac); err != nil {
			return false, reqErr("SEND_RARP: %v", err)
		}
	case ReqNetSetMTU:
		mtu, _ := decodeU64(p)
		if mtu < 68 || mtu > 65535 {
			return false, reqErr("MTU %d", mtu)
		}
		if err := s.h.SetMTU(int(mtu)); err != nil {
			return false, reqErr("MTU %d: %v", mtu, err)
		}
	}
	return false, nil
}

// setFeatures fixes the session's ring features and the device's header length
// (Config.HeaderLen) for the acks, on running rings too.
//
// VHOST_F_LOG_ALL turns dirty logging on or off for every ring whose address says
// VHOST_VRING_F_LOG: QEMU sends SET_FEATURES again with it set when a migration starts
// and cleared when it ends or fails (hw/virtio/vhost.c vhost_dev_set_log). The device
// hears of every SET_FEATURES, logging ones included.
func (s *Session) setFeatures(f uint64) {
	s.features, s.featuresOK = f, true
	s.hdrLen = s.b.cfg.HeaderLen(f)
	s.logAll = f&(1<<virtio.LogAll) != 0
	fe := s.feats()
	for _, v := range s.rings {
		v.mu.Lock()
		if v.state == ringRunning {
			v.hdrLen = fe.hdrLen
			v.ring.setFeats(fe)
		}
		v.setLogLocked(s.log, s.logAll)
		v.mu.Unlock()
	}
	s.stats.Logging.Store(s.logAll && s.log != nil)
	s.h.FeaturesAcked(Features{Bits: f, HdrLen: s.hdrLen})
}

// setLogBase maps the dirty log SET_LOG_BASE carries ({mmap_size, mmap_offset} and one
// fd, PROTOCOL_F_LOG_SHMFD) and swaps it into every ring under the ring's lock before
// the old one is unmapped, as setMemTable does with guest memory: QEMU sends a new one
// whenever the log must grow (hw/virtio/vhost.c vhost_dev_log_resize), rings running.
// QEMU waits for the reply, a header with no payload (hw/virtio/vhost-user.c
// vhost_user_set_log_base reads one; DPDK's vhost_user_set_log_base answers with size
// 0). A log that cannot be mapped ends the session: QEMU only logs that failure and
// would migrate on, copying none of the pages this back-end writes, so the guest would
// arrive with corrupt memory; a back-end that goes away instead costs frames, not data.
func (s *Session) setLogBase(m *message, p []byte) error {
	le := binary.LittleEndian
	size, offset := le.Uint64(p[0:]), le.Uint64(p[8:])
	l, err := mapLog(m.takeFd(0), size, offset, s.stats, s.b.mem, s.mem.mapped())
	if err != nil {
		return protoErr("SET_LOG_BASE: %v", err)
	}
	old := s.log
	s.log = l
	for _, v := range s.rings {
		v.mu.Lock()
		v.setLogLocked(s.log, s.logAll)
		v.mu.Unlock()
	}
	old.unmap()
	s.stats.Logging.Store(s.logAll && s.log != nil)
	return s.c.reply(m.req, nil)
}

func (s *Session) feats() feats {
	f := s.features
	return feats{
		eventIdx:   f&(1<<virtio.RingEventIdx) != 0,
		indirect:   f&(1<<virtio.RingIndirectDesc) != 0,
		protoAcked: f&protocolFeaturesMask != 0,
		hdrLen:     s.hdrLen,
	}
}

// setMemTable maps the new table, then swaps it into every ring under the ring's lock
// and re-translates running rings (libvhost-user vu_set_mem_table_exec), and only then
// unmaps the old table: no ring can be inside a batch on the old mapping by then.
func (s *Session) setMemTable(m *message, p []byte) error {
	t, _ := decodeMemTable(p)
	fds := make([]int, m.nfds)
	for i := range fds {
		fds[i] = m.takeFd(i)
	}
	g, unsealed, err := mapMemTable(&t, fds, s.b.mem, s.log.mapped())
	if err != nil {
		return reqErr("SET_MEM_TABLE: %v", err)
	}
	if unsealed != "" {
		s.b.warn("vhost-user: guest memory memfds not sealed against shrinking (F_SEAL_SHRINK): "+
			"a front-end that truncates them ends its session with a fault", "regions", unsealed)
	}
	old := s.mem
	s.mem = g
	for _, v := range s.rings {
		v.mu.Lock()
		v.mem = g
		if v.state == ringRunning && !v.broken && !v.ring.remap(g) {
			v.failLocked(RejectRingAddr)
		}
		if v.broken {
			// Not re-translated: no view of the old table may outlive its unmap.
			v.ring.unmap()
		}
		v.unlockAsync()
	}
	old.unmap()
	return nil
}

func (s *Session) vringState(req uint32, v *Vring, st vuproto.VringState) (bool, error) {
	switch req {
	case ReqSetVringEnable:
		// Kept per index, independent of ring setup: QEMU sends it before
		// SET_FEATURES and repeats it (hw/net/virtio-net.c peer_attach).
		if st.Num > 1 {
			return false, reqErr("SET_VRING_ENABLE num %d", st.Num)
		}
		v.mu.Lock()
		v.enableReq = st.Num == 1
		if v.state == ringRunning {
			v.enabled.Store(v.enableReq)
		}
		v.mu.Unlock()
		s.h.VringEnabled(v, st.Num == 1)
		return false, nil
	case ReqGetVringBase:
		v.mu.Lock()
		running := v.announced && v.state == ringRunning && !v.broken
		v.mu.Unlock()
		if running {
			s.h.RingStopping(v)
		}
		v.mu.Lock()
		wasAnnounced := v.announced
		v.announced = false
		last := v.stopLocked()
		v.unlockAsync()
		if wasAnnounced {
			s.stopped(v)
		}
		return true, s.c.replyState(req, vuproto.VringState{Index: st.Index, Num: uint32(last)})
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state == ringRunning {
		return false, reqErr("request %d on running ring %d", req, st.Index)
	}
	switch req {
	case ReqSetVringNum:
		if st.Num == 0 || st.Num > MaxRingSize || st.Num&(st.Num-1) != 0 {
			return false, reqErr("ring %d size %d", st.Index, st.Num)
		}
		v.num = st.Num
	case ReqSetVringBase:
		if st.Num > 0xffff {
			return false, reqErr("ring %d base %d", st.Index, st.Num)
		}
		v.base = uint16(st.Num)
	}
	return false, nil
}

// stopped tells the owner that v stopped (Handler.RingStopped, which joins the ring's
// worker). The worker may be asleep in a write to an eventfd the front-end blocked
// (signal.go), its own ring's or another's (Poke writes to the pair's TX kick from the
// RX worker): while the owner waits, every ring's eventfds are unjammed every
// unjamEvery, so that the write returns and the worker with it.
func (s *Session) stopped(v *Vring) {
	if !s.busyFDs() {
		s.h.RingStopped(v)
		return
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(unjamEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if !s.busyFDs() {
					return
				}
			}
		}
	}()
	s.h.RingStopped(v)
	close(done)
}

// busyFDs unjams every ring's eventfds that have a write in flight and reports whether
// any has.
func (s *Session) busyFDs() bool {
	busy := false
	for _, r := range s.rings {
		r.mu.Lock()
		if r.busyFDsLocked() {
			busy = true
		}
		r.mu.Unlock()
	}
	return busy
}

// unjamEvery is how often a stopping ring's eventfds are unjammed while its worker is
// joined (Session.stopped).
const unjamEvery = 20 * time.Millisecond

func reqName(req uint32) string {
	switch req {
	case ReqSetVringKick:
		return "SET_VRING_KICK"
	case ReqSetVringCall:
		return "SET_VRING_CALL"
	case ReqSetVringErr:
		return "SET_VRING_ERR"
	}
	return fmt.Sprintf("request %d", req)
}

// teardown stops every ring and unmaps guest memory: the session's end is a stop for
// every running ring (QEMU then recovers last_avail_idx from used->idx, hw/virtio/
// virtio.c virtio_queue_split_restore_last_avail_idx).
func (s *Session) teardown() {
	// Every ring stops, and every eventfd is closed (a write asleep on one unjammed),
	// before any worker is joined: a worker may be asleep on another ring's fd.
	announced := make([]bool, len(s.rings))
	for i, v := range s.rings {
		v.mu.Lock()
		announced[i] = v.announced
		v.announced = false
		v.stopLocked()
		v.setFDLocked(&v.errf, nil)
		v.mem = nil
		v.unlockAsync()
	}
	for i, v := range s.rings {
		if announced[i] {
			s.stopped(v)
		}
	}
	s.mem.unmap()
	s.mem = nil
	for _, v := range s.rings {
		v.mu.Lock()
		v.setLogLocked(nil, false)
		v.mu.Unlock()
	}
	s.log.unmap()
	s.log, s.logAll = nil, false
	s.stats.Logging.Store(false)
}
