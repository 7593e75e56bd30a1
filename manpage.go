package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// writeManPage writes tapgro(8) in roff from the flag set parseFlags defines, so that a
// package's man page lists every flag with its own help text and default (`tapgro
// __manpage > tapgro.8`).
func writeManPage(w io.Writer) error {
	var fs *flag.FlagSet
	captureFlags = func(f *flag.FlagSet) { fs = f }
	parseFlags(nil, io.Discard) // only its definitions are wanted: the missing --tap fails after them
	captureFlags = nil
	if fs == nil {
		return fmt.Errorf("manpage: the flag set was not captured")
	}
	var b strings.Builder
	b.WriteString(`.TH TAPGRO 8 "" "tapgro ` + roff(version) + `" "System Administration"
.SH NAME
tapgro \- vhost-user-net back-end, and GRO for QEMU's socket netdevs, on a Linux TAP device
.SH SYNOPSIS
.B tapgro
\-\-tap \fINAME\fR \-\-netdev \fISPEC\fR [\fIOPTION\fR]...
.br
.B tapgro
\-\-tap \fINAME\fR \-\-socket\-path \fIPATH\fR [\fIOPTION\fR]...
.br
.B tapgro ctl
[\fIOPTION\fR]... \fIREQUEST\fR
.br
.B tapgro demo
.br
.B tapgro
\-\-print\-capabilities
.SH DESCRIPTION
tapgro connects a TAP device opened with IFF_VNET_HDR to a QEMU guest. As a
vhost-user-net back-end it moves frames between the guest's rings and the TAP with the
guest's virtio-net header passed straight through. On QEMU's socket netdevs (stream,
socket, dgram) and netmap, and on vhost-user where the two ends differ, it coalesces
MTU-sized TCP and UDP segments into 64 KB GSO packets (GRO) and segments TSO packets for
a peer that cannot take them. After set-up it confines itself (see \-\-sandbox).
.SH OPTIONS
`)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		b.WriteString(".TP\n.B \\-\\-" + strings.ReplaceAll(f.Name, "-", "\\-"))
		if arg != "" {
			b.WriteString(" \\fI" + roff(arg) + "\\fR")
		}
		b.WriteString("\n" + roff(usage))
		if f.DefValue != "" && f.DefValue != "false" {
			b.WriteString(" (default: " + roff(f.DefValue) + ")")
		}
		b.WriteString("\n")
	})
	b.WriteString(".SH ENVIRONMENT\nEach variable sets its option when the command line leaves it out; an empty one counts as unset.\n")
	for _, e := range envFlags {
		b.WriteString(".TP\n.B " + e.env + "\nas \\-\\-" + strings.ReplaceAll(e.flag, "-", "\\-") + "\n")
	}
	b.WriteString(`.SH SIGNALS
SIGTERM and SIGINT stop tapgro cleanly (a second one at once); SIGHUP reopens the log
file and the capture files.
.SH SEE ALSO
.BR qemu-system-x86_64 (1),
.BR ip-tuntap (8);
the documentation in /usr/share/doc/tapgro.
`)
	_, err := io.WriteString(w, b.String())
	return err
}

// roff escapes text for a roff line: backslashes, and a leading dot or quote, which
// roff would read as a request.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}
