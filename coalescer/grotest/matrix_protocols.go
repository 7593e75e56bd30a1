package grotest

// protocolCases are the per-protocol switches (TCP off, UDP on and off), TCP over IPv6,
// UDP's own rules, and frames GRO must pass untouched (not TCP/UDP, truncated).
func protocolCases() []Case {
	return []Case{
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
