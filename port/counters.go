package port

// Counter is one of a transport's own counters, as the operator surfaces export it: ops
// turns each into a series without knowing the transport (netmap's ring slots and
// errors, say). Name is the metric's full name; Labels, if any, tell series of one
// family apart; Value reads the counter.
type Counter struct {
	Name, Help string
	Labels     map[string]string
	Value      func() uint64
}

// CounterSource is implemented by an endpoint or port whose transport keeps counters
// beyond Stats.
type CounterSource interface{ Counters() []Counter }
