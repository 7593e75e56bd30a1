// Package grotest is the GRO engine's correctness suite as data, for tests: frame
// builders (Ethernet/VLAN, IPv4 with options and fragments, IPv6 with extension
// headers, TCP with options and every flag, UDP; correct checksums unless asked
// otherwise; addresses from 198.18.0.0/15 and fd00:198:18::/64), the Matrix of cases
// with the exact packets each must produce, and CheckGroups, which holds an engine's
// output to them: a frame passed through must be untouched, a GSO packet's header
// exact, and re-segmenting it must give back exactly its inputs.
//
// Package coalescer runs the Matrix against its engine directly (TestMatrix), and
// package vhostnet runs it through a real TAP behind the vhost-user port, so both ports
// are held to one set of rules. Nothing outside tests imports it.
package grotest
