package grotest

// flowCases are what makes a flow (IPv6 flow label, VLAN tag, interleaved flows), the
// flow table's limit, the 65535-byte and segment-count caps, and single or padded
// segments.
func flowCases() []Case {
	return []Case{
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
	}
}
