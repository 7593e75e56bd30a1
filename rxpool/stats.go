package rxpool

import (
	"math/bits"
	"sync/atomic"
)

// Reason says why a flush happened.
type Reason int

const (
	// ReasonBatchEnd: the source had nothing more to read right now (the common case).
	ReasonBatchEnd Reason = iota
	// ReasonPoolFull: the next frame did not fit, so the pool was emptied first.
	ReasonPoolFull
	// ReasonThreshold: after a stall, the port's free room reached the threshold.
	ReasonThreshold
	// ReasonDeadline: after a stall, the flush delay passed before the threshold did.
	ReasonDeadline
	// ReasonFrame: per-frame mode (Config.PerFrame), the baseline relay.
	ReasonFrame

	// NumReasons sizes Stats.Flushes.
	NumReasons
)

var reasonNames = [NumReasons]string{"batch_end", "pool_full", "threshold", "deadline", "frame"}

func (r Reason) String() string {
	if r < 0 || r >= NumReasons {
		return "unknown"
	}
	return reasonNames[r]
}

// Drop says why staged or offered frames were discarded.
type Drop int

const (
	// DropTooBig: a frame (or all segments of one GSO frame) larger than the whole pool,
	// which no flush can make room for: the hard cap on queued bytes.
	DropTooBig Drop = iota
	// DropPortError: frames that were staged when the port failed (Discard).
	DropPortError

	// NumDrops sizes Stats.Drops.
	NumDrops
)

var dropNames = [NumDrops]string{"too_big", "port_error"}

func (d Drop) String() string {
	if d < 0 || d >= NumDrops {
		return "unknown"
	}
	return dropNames[d]
}

// BatchBounds are the inclusive upper bounds of the frames-per-write histogram buckets;
// Stats.BatchFrames has one more bucket for anything larger.
var BatchBounds = [...]int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// batchBucket returns the histogram bucket of a write that moved n >= 1 frames.
func batchBucket(n int) int {
	return min(bits.Len(uint(n-1)), len(BatchBounds))
}

// Stats are plain atomic counters, written by the pool's goroutine and read by anyone
// (metrics). One Stats may outlive many Pools.
type Stats struct {
	FramesStaged atomic.Uint64 // frames committed to the pool (published at each Flush)
	BytesStaged  atomic.Uint64
	FramesSent   atomic.Uint64 // frames the port took
	BytesSent    atomic.Uint64

	// Writes counts TryWriteBatch calls (each at least one write system call; the port's
	// own counters have the exact syscall count). Batches counts those that moved at
	// least one frame, and BatchFrames is their histogram by frames moved: bucket i holds
	// BatchBounds[i-1] < n <= BatchBounds[i], the last bucket n > 1024. Not cumulative.
	Writes      atomic.Uint64
	Batches     atomic.Uint64
	BatchFrames [len(BatchBounds) + 1]atomic.Uint64

	Flushes [NumReasons]atomic.Uint64 // flush decisions by reason

	// Stalls counts ErrWouldBlock answers from the port. BlockedNanos is the time spent
	// waiting for it: in writes that ended on a full socket (a stream port completes a
	// record it began before returning), for writability, and in the flush delay.
	Stalls       atomic.Uint64
	BlockedNanos atomic.Uint64

	Drops [NumDrops]atomic.Uint64 // frames dropped, by reason

	SkippedBuffers atomic.Uint64 // buffers left empty at the slab's end to keep a frame contiguous
	// InUse is the capacity in buffers that staged frames hold (gauge; updated at each
	// Flush and Release): a copy the buffers it spans, a vector those it would span
	// (Pool.InUse). MaxInUse is the most at the start of a Flush.
	InUse    atomic.Int64
	MaxInUse atomic.Int64
}
