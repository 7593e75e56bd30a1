#!/bin/sh
# qemu.sh PREFIX — unpacks bookworm-backports' QEMU (10.0 today) into PREFIX, beside
# Debian 12's own 7.2, without installing it: qemu-system-x86, qemu-system-data and the
# seabios it needs (its Depends wants a newer one than bookworm's), fetched with apt-get
# download through a private source list and state (apt.sh) and unpacked with dpkg-deb -x.
# The binary is PREFIX/usr/bin/qemu-system-x86_64; it runs with Debian 12's libraries
# (those Debian's qemu-system-x86 7.2 pulls in) and must be given
#   -L PREFIX/usr/share/seabios -L PREFIX/usr/share/qemu
# so that it loads its own firmware, not 7.2's. PREFIX/version holds the packages'
# versions. The result is reused while PREFIX/stamp matches the hash of these scripts and
# of the versions the suite offers (the candidates are checked against fresh lists at
# most once a day).
set -eu

[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 2; }
prefix=$1
suite=bookworm-backports
here=$(cd "$(dirname "$0")" && pwd)
. "$here/apt.sh"
pkgs="qemu-system-x86 qemu-system-data seabios"

mkdir -p "$prefix"
exec 9>"$prefix/.lock"
flock 9

# Fresh lists at most once a day; a failed refresh (no registry) keeps the old ones.
lists="$apt_state/lists-$suite"
if [ -z "$(find "$lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n1)" ]; then
	apt_update "$suite" || echo "qemu.sh: cannot refresh $suite's package lists" >&2
fi
versions=""
for p in $pkgs; do
	v=$(apt_candidate "$suite" "$p")
	[ -n "$v" ] || { echo "qemu.sh: $p has no candidate in $suite" >&2; exit 1; }
	versions="$versions $p=$v"
done
stamp=$({ cat "$here/qemu.sh" "$here/apt.sh"; echo "$versions"; } | sha256sum | cut -d' ' -f1)
if [ -x "$prefix/usr/bin/qemu-system-x86_64" ] && [ "$(cat "$prefix/stamp" 2>/dev/null)" = "$stamp" ]; then
	exit 0
fi

work=$(mktemp -d /var/tmp/tapgro-qemu.XXXXXX)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2086
apt_download "$suite" "$work" $versions
rm -f "$prefix/stamp"
rm -rf "$prefix/usr"
for d in "$work"/*.deb; do
	dpkg-deb -x "$d" "$prefix"
done
"$prefix/usr/bin/qemu-system-x86_64" --version >/dev/null ||
	{ echo "qemu.sh: the unpacked QEMU does not run (a library missing? apt-get install qemu-system-x86 pulls in what it needs)" >&2; exit 1; }
echo "$versions" >"$prefix/version"
echo "$stamp" >"$prefix/stamp"
