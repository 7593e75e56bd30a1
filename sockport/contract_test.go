package sockport

import (
	"testing"
	"time"

	"tapgro/port"
	"tapgro/port/porttest"
)

// Every port sockport makes keeps the port contract (port/porttest): QEMU-framed
// streams over AF_UNIX and TCP, vnet-hdr=on streams with and without shared memory,
// and datagrams over AF_UNIX. UDP is left to TestDgram*: loopback drops datagrams a
// reader has not caught up with, and the kit needs a lossless pair.
func TestPortContract(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run("stream/"+kind, func(t *testing.T) {
			porttest.Run(t, func(t testing.TB) (port.Port, port.Port) { return streamPorts(t, kind) })
		})
	}
	for _, kind := range []string{"unix", "tcp", "shm"} {
		t.Run("vnet/"+kind, func(t *testing.T) {
			porttest.Run(t, func(t testing.TB) (port.Port, port.Port) {
				return vnetPorts(t, kind, VnetStreamAccepts, VnetStreamAccepts)
			})
		})
	}
	t.Run("dgram/unix", func(t *testing.T) {
		porttest.Run(t, func(t testing.TB) (port.Port, port.Port) {
			a, b := dgramPorts(t, "unix")
			// A reader the scheduler starves past dgramSendWait would make the writer
			// drop by design (TestDgramSendGivesUp); the kit is about the contract.
			a.sendWait, b.sendWait = time.Minute, time.Minute
			return a, b
		})
	})
}
