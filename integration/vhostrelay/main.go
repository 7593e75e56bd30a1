//go:build linux

// Command vhostrelay is package tapgro/demo/vhostrelay as a program of its own, for the
// benchmark and the tests: a guest's stand-in on tapgro's vhost-user socket.
package main

import (
	"os"

	"tapgro/demo/vhostrelay"
)

func main() { os.Exit(vhostrelay.Main(os.Args[1:])) }
