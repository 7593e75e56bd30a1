// Package onoff is the one rule for switch words: every on/off value tapgro reads (its
// flags, its --netdev options, `tapgro ctl` requests) is parsed by Parse and every one it
// prints is formatted by String, so the words accepted never differ between surfaces.
// The accepted words are QEMU's for a boolean option (util/qemu-option.c
// parse_option_bool: on, yes, true, y and off, no, false, n) and 1 and 0.
package onoff

// Parse reads a switch word; ok is false for anything else.
func Parse(s string) (on, ok bool) {
	switch s {
	case "on", "yes", "true", "y", "1":
		return true, true
	case "off", "no", "false", "n", "0":
		return false, true
	}
	return false, false
}

// String is the word tapgro prints for a switch: on or off.
func String(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
