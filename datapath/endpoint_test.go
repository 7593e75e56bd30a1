package datapath

import "tapgro/netdev"

// The command hands Serve a netdev.Endpoint as it is; this holds the two interfaces to
// each other where the engine is tested, not only where the command is built.
var _ Endpoint = netdev.Endpoint(nil)
