package grotest

// headerCases are what the headers of a flow's segments must keep, or may change, to
// merge: checksums, sequence and ACK numbers, TCP options, the IPv4 and IPv6 header
// fields, IPv4 options and fragments, IPv6 extension headers, and the IP ID rules.
func headerCases() []Case {
	return []Case{
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
	}
}
