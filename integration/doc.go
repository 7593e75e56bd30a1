// Package integration tests tapgro the way its users run it: the real binary, real TAP
// devices in network namespaces the tests create, real ping, real TCP transfers checked
// byte for byte with SHA-256, and (where noted) real iperf3 and QEMU.
//
// Topology. Each test makes two namespaces, A and B. In each, a tapgro opens TAP tg0
// (198.18.0.1/24 and fd00:198:18::1/64 in A, .2 and ::2 in B). The two tapgro processes are
// joined by one of QEMU's backends — stream over UNIX or TCP, socket listen/connect or udp,
// dgram over UNIX or UDP — so the bytes between them are exactly what a QEMU guest's
// -netdev would exchange. Backends over IP use a veth pair "wire0" (198.19.0.0/24) as the
// network between the two "hosts"; UNIX sockets are shared through the file system.
//
//	netns A                                             netns B
//	198.18.0.1 ─ tg0 ─ tapgro ══ backend (wire0 / UNIX) ══ tapgro ─ tg0 ─ 198.18.0.2
//
// Because A's TAP has TSO on, A's kernel hands tapgro 64 KB GSO frames which tapgro
// segments to MTU frames, as it must for a QEMU guest; B's tapgro coalesces them back into
// GSO packets for B's TAP. The same holds in the other direction.
//
// QEMU. The tests with a real guest (TestQEMU*) run once per QEMU and guest-kernel
// flavour, as subtests named by it: Debian 12's QEMU 7.2 with a Linux 6.1 guest, and
// bookworm-backports' QEMU 10.0 (unpacked, not installed) with a Linux 6.12 guest
// (flavour_test.go). TAPGRO_QEMU_FLAVOURS=name,... runs only those named.
//
// Privilege. Everything here needs root and /dev/net/tun. Tests skip with the reason when
// those are missing, except under TAPGRO_REQUIRE_PRIV=1 (set by the README's test command
// when run as root, and so in CI), where a missing privilege fails the test instead.
// Namespaces are named "tapgro-test-*" and deleted by each test's cleanup; processes are
// killed by PID.
package integration
