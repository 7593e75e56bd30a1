#!/bin/sh
# Builds tapgro's Debian package with Debian's own dpkg-deb, from this checkout:
#
#   contrib/deb/build.sh [OUTDIR]      -> OUTDIR/tapgro_VERSION_ARCH.deb (default: .)
#
# Contents (Debian 12 paths; `dpkg -c` lists them):
#   /usr/bin/tapgro                          static (CGO_ENABLED=0), version stamped in
#   /lib/systemd/system/tapgro@.service …    the four units of contrib/systemd, ExecStart
#                                            pointing at /usr/bin/tapgro
#   /usr/lib/sysusers.d/tapgro.conf          the account the units drop to (--user tapgro)
#   /usr/share/qemu/vhost-user/50-tapgro.json  QEMU's back-end descriptor
#                                            (docs/interop/vhost-user.rst, "Backend
#                                            program conventions")
#   /usr/share/man/man8/tapgro.8.gz          written by `tapgro __manpage` from the flag
#                                            definitions, so it lists every flag
#   /usr/share/doc/tapgro/                   README.md, docs/*.md (as docs/, so the
#                                            README's links hold), copyright
#
# The maintainer scripts do what dh_installsysusers and dh_installsystemd would: create
# the account at configure, reload systemd's units when systemd runs. No unit is enabled
# or started: each instance names a TAP, which only the host's administrator knows.
#
# Environment: GO (the go command, default `go`), VERSION (default 0~gitYYYYMMDD.HASH
# from the checkout's last commit), SOURCE_DATE_EPOCH (default that commit's time; file
# times and gzip headers follow it, so two builds of one commit are byte-identical).
set -eu
cd "$(dirname "$0")/../.."
out=$(realpath "${1:-.}")
GO=${GO:-go}

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH
if [ -z "${VERSION:-}" ]; then
	if hash=$(git rev-parse --short=7 HEAD 2>/dev/null); then
		VERSION="0~git$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d).$hash"
		git diff --quiet HEAD 2>/dev/null || VERSION="$VERSION+dirty"
	else
		VERSION="0~unknown"
	fi
fi
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
doc="$root/usr/share/doc/tapgro"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/lib/sysusers.d" \
	"$root/usr/share/qemu/vhost-user" "$root/usr/share/man/man8" "$doc/docs"

# -trimpath and a fixed build ID keep the binary the same from one build to the next.
CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath" "$GO" build -buildvcs=false \
	-ldflags "-s -w -buildid= -X main.version=$VERSION" -o "$root/usr/bin/tapgro" .

for unit in tapgro@.service tapgro@.socket tapgro-vhost@.service tapgro-vhost@.socket; do
	sed 's|/usr/local/bin/tapgro|/usr/bin/tapgro|g' "contrib/systemd/$unit" >"$root/lib/systemd/system/$unit"
done
cp contrib/systemd/tapgro.sysusers.conf "$root/usr/lib/sysusers.d/tapgro.conf"
cp contrib/qemu/50-tapgro.json "$root/usr/share/qemu/vhost-user/"
"$root/usr/bin/tapgro" __manpage | gzip -9n >"$root/usr/share/man/man8/tapgro.8.gz"
cp README.md "$doc/"
cp docs/*.md "$doc/docs/"
cat >"$doc/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tapgro
Comment: Built from the tapgro source tree by contrib/deb/build.sh.
 The Go modules it links are listed by `go version -m /usr/bin/tapgro`.

Files: *
Copyright: the tapgro authors
License: no license has been chosen upstream yet
COPYRIGHT

# Debian's sysusers helper (dh_installsysusers) runs systemd-sysusers at configure; a
# host without systemd gets the same account from useradd.
cat >"$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		systemd-sysusers tapgro.conf
	elif ! getent passwd tapgro >/dev/null; then
		useradd --system --user-group --no-create-home --home-dir / --shell /usr/sbin/nologin \
			--comment "tapgro bridge" tapgro
	fi
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
fi
POSTINST
cat >"$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
# The account stays on purge, as Debian's policy for system users has it (files it
# owned may outlive the package).
if [ -d /run/systemd/system ]; then
	systemctl --system daemon-reload >/dev/null || true
fi
POSTRM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"

size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: tapgro
Version: $VERSION
Architecture: $arch
Maintainer: tapgro authors <tapgro@localhost>
Installed-Size: $size
Section: net
Priority: optional
Recommends: iproute2
Suggests: qemu-system-x86, iperf3
Homepage: file:///usr/share/doc/tapgro/README.md
Description: vhost-user-net back-end and userspace GRO on a Linux TAP device
 tapgro connects a TAP device opened with IFF_VNET_HDR to a QEMU guest. It is
 a vhost-user-net back-end (TSO both ways, mergeable receive buffers,
 EVENT_IDX, multiqueue, live migration with dirty logging) that confines itself
 after start-up (namespaces, no capabilities, seccomp, Landlock). On QEMU's
 stream, socket and dgram netdevs and on netmap it coalesces MTU-sized TCP and
 UDP segments into 64 KB GSO packets, as the kernel's GRO does.
CONTROL
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb="$out/tapgro_${VERSION}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
