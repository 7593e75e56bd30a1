package grotest

// Matrix is the GRO correctness suite: every rule of when segments merge and when they
// must not — segment sizes, reordering and retransmission, bad or missing checksums,
// IP and TCP header changes (TTL, TOS, ID, DF, options, flow label, extension headers),
// flag placement (PSH, FIN, RST, URG, SYN, CWR/ECE), flow-table limits, UDP, VLAN tags,
// padding and malformed frames — each as input frames and the exact packets the engine
// must emit for them.
func Matrix() []Case {
	return []Case{
		{
			Name: "same size",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2, 3}},
			Counts: map[string]int{"merged": 3, "started": 1, "batch_end": 1},
		},
		{
			Name: "large then small then large",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(500), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2}, {3}},
			Counts: map[string]int{"short_segment": 1},
		},
		{
			Name: "small then large",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(500), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1, 2}},
			Counts: map[string]int{"larger_segment": 1},
		},
		{
			Name: "pure ACK flushes and keeps order",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(0, WithAck(0x2000)), f.Seg(MSS, WithAck(0x2000))}
			},
			Groups: [][]int{{0, 1}, {2}, {3}},
			Counts: map[string]int{"pure_ack": 1},
		},
		{
			Name: "dup ACK",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(0)}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"dup_ack": 1},
		},
		{
			Name: "PSH merges as last",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, OrFlags(TCPPSH)), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2}, {3}},
			Counts: map[string]int{"psh": 1, "batch_end": 1},
		},
		{
			Name: "PSH alone passes",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS, OrFlags(TCPPSH)), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"psh": 1},
		},
		{
			Name: "SYN",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(0, WithFlags(TCPSYN|TCPACK))}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"syn": 1},
		},
		{
			Name: "RST",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(0, WithFlags(TCPRST|TCPACK))}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"fin_rst_urg": 1},
		},
		{
			Name: "URG",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, OrFlags(TCPURG)), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}, {2}, {3}},
			Counts: map[string]int{"fin_rst_urg": 1},
		},
		{
			Name: "FIN with data merges as last",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(100, OrFlags(TCPFIN|TCPPSH))}
			},
			Groups: [][]int{{0, 1, 2}},
			Counts: map[string]int{"fin_rst_urg": 1},
			NoEnd:  true,
		},
		{
			Name: "bare FIN",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(0, OrFlags(TCPFIN))}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"fin_rst_urg": 1},
		},
		{
			Name: "CWR without ECN passes",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, OrFlags(TCPCWR)), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}, {2}, {3, 4}},
			Counts: map[string]int{"cwr": 1},
		},
		{
			Name:   "CWR with ECN starts an aggregate",
			Engine: Engine{ECN: true},
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, OrFlags(TCPCWR)), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}, {2, 3, 4}},
			Counts: map[string]int{"cwr": 1},
		},
		{
			Name: "ECE on every segment merges",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", func(s *Spec) { s.Flags |= 0x40 })
				return [][]byte{f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}},
		},
		{
			Name: "ECE change flushes",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, OrFlags(0x40))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"flags_changed": 1},
		},
		{
			Name: "bad checksum in the middle",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, BadL4), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}, {2}, {3, 4}},
			Counts: map[string]int{"bad_checksum": 1},
		},
		{
			Name: "bad checksum first",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS, BadL4), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1, 2}},
			Counts: map[string]int{"bad_checksum": 1},
		},
		{
			Name: "bad IPv4 header checksum",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, BadIP), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}, {2}},
			Counts: map[string]int{"bad_checksum": 1},
		},
		{
			Name: "seq gap",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				a, b := f.Seg(MSS), f.Seg(MSS)
				f.Seg(MSS) // lost
				f.id--     // ...but the IDs stay consecutive: a pure seq gap
				return [][]byte{a, b, f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}, {2, 3}},
			Counts: map[string]int{"out_of_order": 1},
		},
		{
			Name: "retransmission (seq back)",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, WithSeq(1000))}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"out_of_order": 1},
		},
		{
			Name: "timestamp change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, WithOpts(TSOpts(2))), f.Seg(MSS, WithOpts(TSOpts(2)))}
			},
			Groups: [][]int{{0, 1}, {2, 3}},
			Counts: map[string]int{"options_changed": 1},
		},
		{
			Name: "option length change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithOpts(nil))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"options_changed": 1},
		},
		{
			Name: "ack change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithAck(0x1001))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"ack_changed": 1},
		},
		{
			Name: "ECN CE mark (TOS) change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithTOS(0x02))
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithTOS(0x03)), f.Seg(MSS, WithTOS(0x03))}
			},
			Groups: [][]int{{0}, {1, 2}},
			Counts: map[string]int{"tos_ttl_changed": 1},
		},
		{
			Name: "TTL change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithTTL(63))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"tos_ttl_changed": 1},
		},
		{
			Name: "DF change",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithDF(false))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"tos_ttl_changed": 1},
		},
		{
			Name: "v6 traffic class change",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithTOS(0x03))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"tos_ttl_changed": 1},
		},
		{
			Name: "v6 hop limit change",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithTTL(1))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"tos_ttl_changed": 1},
		},
		{
			Name: "IPv4 options",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithIPOpt), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}, {2, 3}},
			Counts: map[string]int{"ip_options": 1},
		},
		{
			Name: "IPv4 fragment",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, WithMF), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}, {2}},
			Counts: map[string]int{"fragment": 1},
		},
		{
			// A chain that differs from the aggregate's (here: none vs one) flushes.
			Name: "IPv6 extension header appears and goes",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, DstOpts), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}, {2, 3}},
			Counts: map[string]int{"ipv6_ext_header": 2},
		},
		{
			// Linux ipv6_gro_receive pulls HBH/DSTOPTS/ROUTING and merges segments whose
			// chains are byte-identical.
			Name: "IPv6 identical extension headers merge",
			Frames: func() [][]byte {
				f := NewFlow("tcp6", DstOpts)
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS), f.Seg(100)}
			},
			Groups: [][]int{{0, 1, 2, 3}},
			Counts: map[string]int{"ipv6_ext_header": 0, "short_segment": 1},
		},
		{
			Name: "IPv6 identical two-header chains merge",
			Frames: func() [][]byte {
				f := NewFlow("tcp6", HbhDstOpts, WithVLAN(7))
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name: "IPv6 extension header bytes differ",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS, DstOptsPad(1)), f.Seg(MSS, DstOptsPad(1)), f.Seg(MSS, DstOptsPad(2)), f.Seg(MSS, DstOptsPad(2))}
			},
			Groups: [][]int{{0, 1}, {2, 3}},
			Counts: map[string]int{"ipv6_ext_header": 1},
		},
		{
			Name: "IPv6 extension header type differs, same bytes",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				hbh := func(s *Spec) { s.ExtType, s.Ext = IPv6HopByHop, []byte{0, 0, 1, 4, 0, 0, 0, 0} }
				return [][]byte{f.Seg(MSS, DstOpts), f.Seg(MSS, hbh)}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"ipv6_ext_header": 1},
		},
		{
			Name: "IPv6 routing header, no segments left, merges",
			Frames: func() [][]byte {
				f := NewFlow("tcp6", RoutingHdr(0))
				return [][]byte{f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1}},
		},
		{
			// The pseudo-header uses the final destination (RFC 8200 section 8.1), not
			// the IPv6 destination address the checksum is verified and re-seeded with.
			Name: "IPv6 routing header with segments left passes",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, RoutingHdr(1)), f.Seg(MSS, RoutingHdr(1))}
			},
			Groups: [][]int{{0, 1}, {2}, {3}},
			Counts: map[string]int{"ipv6_ext_header": 2},
		},
		{
			Name:   "udp6 identical extension headers merge",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp6", DstOpts)
				return [][]byte{f.Seg(1200), f.Seg(1200), f.Seg(5)}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name: "IPv6 fragment header",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS, FragHdr), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}, {2}},
			Counts: map[string]int{"fragment": 1},
		},
		{
			// Linux 6.18 tools/testing/selftests/net/gro.c "DF=0, Fixed - should
			// coalesce": inet_gro_flush no longer asks for DF on a fixed ID.
			Name: "IP ID fixed without DF",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithDF(false))
				return [][]byte{f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(7))}
			},
			Groups: [][]int{{0, 1, 2}},
			Counts: map[string]int{"ip_id_changed": 0, "merged": 2},
		},
		{
			Name: "IP ID mixed without DF: +1 twice then fixed",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithDF(false))
				return [][]byte{f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(8)), f.Seg(MSS, WithID(8)), f.Seg(MSS, WithID(8))}
			},
			// The pattern is set by the second segment; the third breaks it and starts
			// an aggregate whose own second segment makes it fixed.
			Groups: [][]int{{0, 1}, {2, 3}},
			Counts: map[string]int{"ip_id_changed": 1},
		},
		{
			Name: "IP ID mixed without DF: fixed then +1",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithDF(false))
				return [][]byte{f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(8))}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"ip_id_changed": 1},
		},
		{
			Name: "IP ID fixed with DF",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS, WithID(0)), f.Seg(MSS, WithID(0)), f.Seg(MSS, WithID(0))}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name:   "udp4 IP ID fixed without DF",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp4", WithDF(false))
				return [][]byte{f.Seg(1200, WithID(3)), f.Seg(1200, WithID(3)), f.Seg(1200, WithID(3))}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name: "IP ID incrementing without DF",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithDF(false))
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name: "IP ID mixed: +1 then fixed",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(8)), f.Seg(MSS, WithID(8)), f.Seg(MSS, WithID(9))}
			},
			Groups: [][]int{{0, 1}, {2, 3}},
			Counts: map[string]int{"ip_id_changed": 1},
		},
		{
			Name: "IP ID jump",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS, WithID(7)), f.Seg(MSS, WithID(9))}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"ip_id_changed": 1},
		},
		{
			Name: "IPv6 flow label is part of the flow",
			Frames: func() [][]byte {
				f := NewFlow("tcp6", WithLabel(0x12345))
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS, WithLabel(0x54321))}
			},
			Groups: [][]int{{0, 1}, {2}},
		},
		{
			Name: "VLAN",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithVLAN(42))
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name: "VLAN tag is part of the flow",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithVLAN(42))
				g := NewFlow("tcp4", WithVLAN(43))
				return [][]byte{f.Seg(MSS), g.Seg(MSS), f.Seg(MSS), g.Seg(MSS)}
			},
			Groups: [][]int{{0, 2}, {1, 3}},
		},
		{
			Name: "interleaved flows, v4/v6",
			Frames: func() [][]byte {
				a := NewFlow("tcp4")
				b := NewFlow("tcp6")
				c := NewFlow("tcp4", WithPort(40001))
				return [][]byte{a.Seg(MSS), b.Seg(1000), c.Seg(MSS), a.Seg(MSS), b.Seg(1000), c.Seg(MSS), a.Seg(MSS), b.Seg(10)}
			},
			Groups: [][]int{{1, 4, 7}, {0, 3, 6}, {2, 5}},
		},
		{
			Name:   "table full evicts oldest",
			Engine: Engine{MaxFlows: 2},
			Frames: func() [][]byte {
				a := NewFlow("tcp4")
				b := NewFlow("tcp4", WithPort(2))
				c := NewFlow("tcp4", WithPort(3))
				return [][]byte{a.Seg(MSS), a.Seg(MSS), b.Seg(MSS), b.Seg(MSS), c.Seg(MSS), a.Seg(MSS)}
			},
			// c evicts a; a's next segment then evicts b.
			Groups: [][]int{{0, 1}, {2, 3}, {4}, {5}},
			Counts: map[string]int{"eviction": 2},
		},
		{
			Name: "65535 size cap",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				var fr [][]byte
				for range 47 {
					fr = append(fr, f.Seg(MSS))
				}
				return fr
			},
			// 20 + 32 + 45×1448 = 65212; one more segment would make 66660.
			Groups: [][]int{Seq(0, 44), {45, 46}},
			Counts: map[string]int{"over_size": 1},
		},
		{
			// Linux skb_gro_receive: the IP length may reach 65535 exactly; a short tail
			// that fits is merged even when a full segment no longer would.
			Name: "65535 size cap reached exactly by a short tail",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.Seg(8072))
				}
				return append(fr, f.Seg(919), f.Seg(100))
			},
			// 20 + 20 + 8×8072 + 919 = 65535; the short tail ends it.
			Groups: [][]int{Seq(0, 8), {9}},
			Counts: map[string]int{"over_size": 0, "short_segment": 1},
		},
		{
			// 65495 = 5 × 13099: full segments fill it exactly, so it is emitted at once.
			Name: "65535 size cap reached exactly by full segments",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				var fr [][]byte
				for range 5 {
					fr = append(fr, f.Seg(13099))
				}
				return fr
			},
			Groups: [][]int{Seq(0, 4)},
			NoEnd:  true,
			Counts: map[string]int{"over_size": 1, "batch_end": 0},
		},
		{
			Name: "65535 size cap: one byte over starts the next packet",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.Seg(8072))
				}
				return append(fr, f.Seg(920))
			},
			Groups: [][]int{Seq(0, 7), {8}},
			Counts: map[string]int{"over_size": 1},
		},
		{
			Name: "65535 size cap, IPv6 with an extension header",
			Frames: func() [][]byte {
				f := NewFlow("tcp6", WithOpts(nil), DstOpts)
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.Seg(8000))
				}
				// 40 + 8 + 20 + 64000 + 1467 = 65535.
				return append(fr, f.Seg(1467), f.Seg(1))
			},
			Groups: [][]int{Seq(0, 8), {9}},
			Counts: map[string]int{"short_segment": 1},
		},
		{
			Name: "huge head takes a tail",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				return [][]byte{f.Seg(64960), f.Seg(535)}
			},
			Groups: [][]int{{0, 1}},
		},
		{
			Name: "full head passes",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				return [][]byte{f.Seg(65495), f.Seg(10)}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"over_size": 1},
		},
		{
			// No TCP segment count cap in Linux GRO by default: 65 segments of 1009
			// bytes plus a 919-byte tail fill one 65535-byte packet.
			Name: "default segment cap does not bind before 65535",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				var fr [][]byte
				for range 64 {
					fr = append(fr, f.Seg(1009))
				}
				return append(fr, f.Seg(919))
			},
			Groups: [][]int{Seq(0, 64)},
			Counts: map[string]int{"segment_cap": 0, "short_segment": 1},
		},
		{
			Name:   "segment cap",
			Engine: Engine{MaxSegments: 4},
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				var fr [][]byte
				for range 6 {
					fr = append(fr, f.Seg(100))
				}
				return fr
			},
			Groups: [][]int{{0, 1, 2, 3}, {4, 5}},
			Counts: map[string]int{"segment_cap": 1},
		},
		{
			Name: "single segment emitted plain",
			Frames: func() [][]byte {
				return [][]byte{NewFlow("tcp4").Seg(MSS)}
			},
			Groups: [][]int{{0}},
		},
		{
			Name: "padded tiny segment emitted as received",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				return [][]byte{f.Seg(2, WithPad(4))}
			},
			Groups: [][]int{{0}},
		},
		{
			Name: "padded head then more",
			Frames: func() [][]byte {
				f := NewFlow("tcp4", WithOpts(nil))
				return [][]byte{f.Seg(2, WithPad(4)), f.Seg(2, WithPad(4)), f.Seg(2, WithPad(4))}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name:   "tcp disabled",
			Engine: Engine{DisableTCP: true},
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				return [][]byte{f.Seg(MSS), f.Seg(MSS)}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"disabled": 2},
		},
		{
			Name: "tcp6",
			Frames: func() [][]byte {
				f := NewFlow("tcp6")
				return [][]byte{f.Seg(MSS), f.Seg(MSS), f.Seg(MSS), f.Seg(7)}
			},
			Groups: [][]int{{0, 1, 2, 3}},
		},
		{
			Name:   "udp4 on",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp4")
				return [][]byte{f.Seg(1200), f.Seg(1200), f.Seg(1200)}
			},
			Groups: [][]int{{0, 1, 2}},
		},
		{
			Name:   "udp6 short last",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp6")
				return [][]byte{f.Seg(1200), f.Seg(1200), f.Seg(3), f.Seg(1200)}
			},
			Groups: [][]int{{0, 1, 2}, {3}},
			Counts: map[string]int{"short_segment": 1},
		},
		{
			Name:   "udp larger flushes",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp4")
				return [][]byte{f.Seg(100), f.Seg(100), f.Seg(200)}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"larger_segment": 1},
		},
		{
			Name: "udp off",
			Frames: func() [][]byte {
				f := NewFlow("udp4")
				return [][]byte{f.Seg(1200), f.Seg(1200)}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"disabled": 2},
		},
		{
			Name:   "udp zero checksum",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp4")
				return [][]byte{f.Seg(1200), f.Seg(1200, ZeroUDP), f.Seg(1200)}
			},
			Groups: [][]int{{0}, {1}, {2}},
			Counts: map[string]int{"no_checksum": 1},
		},
		{
			Name:   "udp bad checksum",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f := NewFlow("udp6")
				return [][]byte{f.Seg(1200), f.Seg(1200), f.Seg(1200, BadL4)}
			},
			Groups: [][]int{{0, 1}, {2}},
			Counts: map[string]int{"bad_checksum": 1},
		},
		{
			Name:   "udp segment cap is 64",
			Engine: Engine{UDP: true, MaxSegments: 100},
			Frames: func() [][]byte {
				f := NewFlow("udp4")
				var fr [][]byte
				for range 66 {
					fr = append(fr, f.Seg(10))
				}
				return fr
			},
			Groups: [][]int{Seq(0, 63), {64, 65}},
		},
		{
			Name:   "tcp and udp of the same ports are different flows",
			Engine: Engine{UDP: true},
			Frames: func() [][]byte {
				f, g := NewFlow("tcp4"), NewFlow("udp4")
				return [][]byte{f.Seg(MSS), g.Seg(100), f.Seg(MSS), g.Seg(100)}
			},
			Groups: [][]int{{0, 2}, {1, 3}},
		},
		{
			Name: "not TCP/UDP",
			Frames: func() [][]byte {
				arp := append(append(append([]byte{}, MACB...), MACA...), 0x08, 0x06)
				arp = append(arp, make([]byte, 28)...)
				return [][]byte{arp, {1, 2, 3}}
			},
			Groups: [][]int{{0}, {1}},
			Counts: map[string]int{"not_tcp_udp": 1, "malformed": 1},
		},
		{
			Name: "truncated IP length passes untouched",
			Frames: func() [][]byte {
				f := NewFlow("tcp4")
				a := f.Seg(MSS)
				b := f.Seg(MSS)
				return [][]byte{a, b[:100]}
			},
			// Unparsable: passes at once (no flow to flush), ahead of held data.
			Groups: [][]int{{1}, {0}},
			Counts: map[string]int{"malformed": 1},
		},
	}
}
