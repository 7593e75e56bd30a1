package grotest

import "slices"

// Matrix is the GRO correctness suite: every rule of when segments merge and when they
// must not — segment sizes, reordering and retransmission, bad or missing checksums,
// IP and TCP header changes (TTL, TOS, ID, DF, options, flow label, extension headers),
// flag placement (PSH, FIN, RST, URG, SYN, CWR/ECE), flow-table limits, UDP, VLAN tags,
// padding and malformed frames — each as input frames and the exact packets the engine
// must emit for them.
func Matrix() []Case {
	return slices.Concat(segmentCases(), headerCases(), flowCases(), protocolCases())
}

// segmentCases are a TCP flow's segments on their own: sizes, ACKs, and where each flag
// may stand in an aggregate.
func segmentCases() []Case {
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
	}
}
