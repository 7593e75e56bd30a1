package main

import (
	"flag"
	"fmt"

	"tapgro/sandbox"
)

// envFlags are the runtime switches an environment variable can set as well, for
// systemd units and container images that configure through the environment. A flag
// given on the command line wins: the environment is the site's default, the command
// line the operator's choice for this instance.
var envFlags = []struct {
	env, flag string
	check     func(string) error
}{
	{"TAPGRO_GRO", "gro", func(v string) error { _, err := onOff("gro", v); return err }},
	{"TAPGRO_UDP_GRO", "udp-gro", func(v string) error { _, err := onOff("udp-gro", v); return err }},
	{"TAPGRO_OFFLOAD", "offload", func(v string) error { _, err := parseOffloads(v); return err }},
	{"TAPGRO_SANDBOX", "sandbox", func(v string) error { _, err := sandbox.ParseMode(v); return err }},
}

// applyEnv sets each env-backed flag the command line left alone from its variable.
// An empty variable counts as unset. A bad value is reported under the variable's name,
// so the operator looks in the right place.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, e := range envFlags {
		v, ok := lookup(e.env)
		if !ok || v == "" || given[e.flag] {
			continue
		}
		if err := e.check(v); err != nil {
			return fmt.Errorf("environment %s=%q: %v", e.env, v, err)
		}
		if err := fs.Set(e.flag, v); err != nil {
			return fmt.Errorf("environment %s=%q: %v", e.env, v, err)
		}
	}
	return nil
}

// resolveCtlSocket is --ctl-socket after parsing: the default path for tap when the
// flag was not given (isDefault), "" when it was given empty (no control socket).
func resolveCtlSocket(fs *flag.FlagSet, path, tap string) (_ string, isDefault bool, _ error) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "ctl-socket" })
	if !given {
		return defaultCtlSocket(tap), true, nil
	}
	// sun_path holds 108 bytes with the terminating NUL (unix(7)).
	if len(path) > 107 {
		return "", false, fmt.Errorf("--ctl-socket %q: a UNIX socket path is at most 107 bytes", path)
	}
	return path, false, nil
}
