package port

import "fmt"

// FrameError reports a frame length outside [MinFrame, MaxFrame] (plus any vnet header):
// a length prefix read from a stream peer, a frame handed to WriteBatch, a netmap TX
// frame. On a stream's read side the stream has lost sync, so the connection cannot
// continue and the caller must Close the Port.
type FrameError struct {
	Length uint64 // the offending length
	Limit  int    // the bound it broke: the minimum if Length < Limit, else the maximum
	// Hint, when set, says what the length most likely means (the stream transport sets
	// it when the length is the first bytes of tapgro's vnet-hdr=on hello).
	Hint string
}

func (e *FrameError) Error() string {
	if e.Length < uint64(e.Limit) {
		return fmt.Sprintf("port: frame length %d is below the minimum %d", e.Length, e.Limit)
	}
	if e.Hint != "" {
		return fmt.Sprintf("port: frame length %d exceeds the maximum %d: %s", e.Length, e.Limit, e.Hint)
	}
	return fmt.Sprintf("port: frame length %d exceeds the maximum %d", e.Length, e.Limit)
}

// CheckFrameLen returns a *FrameError when n is outside [lo, hi].
func CheckFrameLen(n uint64, lo, hi int) error {
	if n < uint64(lo) {
		return &FrameError{Length: n, Limit: lo}
	}
	if n > uint64(hi) {
		return &FrameError{Length: n, Limit: hi}
	}
	return nil
}
