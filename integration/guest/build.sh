#!/bin/sh
# build.sh CACHE_DIR [SUITE] — builds the tapgro test guest: CACHE_DIR/vmlinuz and
# CACHE_DIR/initrd.img.
#
# The kernel and virtio modules come from the linux-image-*-amd64 package that SUITE's
# linux-image-amd64 depends on right now: Debian 12's own (bookworm, the default: Linux
# 6.1) or bookworm-backports (Linux 6.12), fetched with apt-get download (apt.sh: a
# foreign suite through a private source list and state) and unpacked into a temporary
# directory (never installed on this host). busybox-static, iperf3 and ethtool are copied from the host together with every
# shared library ldd lists and the dynamic loader; they are installed with apt-get when
# missing. iputils' ping goes in as /usr/bin/ping next to busybox's /bin/ping (first in the
# guest's PATH): busybox ping cannot set DF, and the MTU tests need ping -M do. /init (the file next to this script) configures eth0 from the kernel command line
# and runs the test's command. The result is reused while CACHE_DIR/stamp matches the hash of
# these scripts, init and SUITE.
set -eu

[ $# -eq 1 ] || [ $# -eq 2 ] || { echo "usage: $0 CACHE_DIR [bookworm|bookworm-backports]" >&2; exit 2; }
cache=$1
suite=${2:-bookworm}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/apt.sh"
stamp=$({ cat "$here/build.sh" "$here/apt.sh" "$here/init"; echo "$suite"; } | sha256sum | cut -d' ' -f1)

fresh() { [ -s "$cache/vmlinuz" ] && [ -s "$cache/initrd.img" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$stamp" ]; }
fresh && exit 0
# Test binaries may build at the same time (go test ./... runs packages in parallel).
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
fresh && exit 0

# In load order (busybox insmod resolves nothing). A kernel that builds one in (6.12 has
# virtio, virtio_ring and virtio_pci built in: its modules.builtin) just skips it.
modules="virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci failover net_failover virtio_net"

need() { # need BINARY PACKAGE
	command -v "$1" >/dev/null 2>&1 && return 0
	[ "$(id -u)" = 0 ] || { echo "build.sh: $1 missing; apt-get install $2" >&2; exit 1; }
	apt-get install -y -q "$2" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "$2" >/dev/null; }
}
need busybox busybox-static
need iperf3 iperf3
need ethtool ethtool
need cpio cpio
# The host's ping must be iputils' (busybox's has no -M).
iping=$(command -v ping || true)
if [ -z "$iping" ] || ! "$iping" -V 2>/dev/null | grep -q iputils; then
	[ "$(id -u)" = 0 ] || { echo "build.sh: iputils ping missing; apt-get install iputils-ping" >&2; exit 1; }
	apt-get install -y -q iputils-ping >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q iputils-ping >/dev/null; }
	iping=/usr/bin/ping
	"$iping" -V 2>/dev/null | grep -q iputils || { echo "build.sh: $iping is not iputils ping" >&2; exit 1; }
fi
# The guest has no libc of its own for busybox: it must be busybox-static's binary.
bb=$(command -v busybox)
if ldd "$bb" >/dev/null 2>&1; then
	echo "build.sh: $bb is dynamically linked; apt-get install busybox-static" >&2
	exit 1
fi

work=$(mktemp -d /var/tmp/tapgro-guest-build.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The kernel: the package SUITE's linux-image-amd64 depends on right now (its candidate
# version in that suite).
kpkg() {
	v=$(apt_candidate "$suite" linux-image-amd64)
	[ -n "$v" ] || return 0
	# shellcheck disable=SC2046
	apt-cache $(apt_opts "$suite") depends "linux-image-amd64=$v" 2>/dev/null |
		sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1
}
pkg=$(kpkg)
if [ -z "$pkg" ]; then
	apt_update "$suite"
	pkg=$(kpkg)
fi
[ -n "$pkg" ] || { echo "build.sh: cannot resolve $suite's linux-image-*-amd64 package" >&2; exit 1; }
apt_download "$suite" "$work" "$pkg"
deb=$(ls "$work"/*.deb)
mkdir "$work/k"
# Only vmlinuz, modules.builtin and the virtio/failover modules: unpacking the whole
# package writes ~400 MB.
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/k" --wildcards \
	'./boot/vmlinuz-*' './lib/modules/*/modules.builtin' './lib/modules/*/kernel/drivers/virtio/*' \
	'./lib/modules/*/kernel/drivers/net/*failover*' './lib/modules/*/kernel/drivers/net/virtio_net*' \
	'./lib/modules/*/kernel/net/core/failover*' 2>/dev/null || true
[ -n "$(ls "$work"/k/boot/vmlinuz-* 2>/dev/null)" ] || { echo "build.sh: no vmlinuz in $pkg" >&2; exit 1; }
rm -f "$deb"

root=$work/root
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/lib/modules" \
	"$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/etc"
: >"$root/lib/modules/order"
for m in $modules; do
	f=$(find "$work/k/lib/modules" -name "$m.ko*" | head -n1)
	if [ -z "$f" ]; then
		grep -q "/$m\.ko\$" "$work"/k/lib/modules/*/modules.builtin 2>/dev/null && continue
		echo "build.sh: module $m is neither in $pkg nor built into it" >&2
		exit 1
	fi
	echo "$m" >>"$root/lib/modules/order"
	# busybox insmod loads plain ELF only.
	case "$f" in
	*.ko) cp "$f" "$root/lib/modules/$m.ko" ;;
	*.ko.xz) xz -dc "$f" >"$root/lib/modules/$m.ko" ;;
	*.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$m.ko" ;;
	*.ko.gz) gzip -dc "$f" >"$root/lib/modules/$m.ko" ;;
	*) echo "build.sh: unknown module format $f" >&2; exit 1 ;;
	esac
done
cp "$(ls "$work"/k/boot/vmlinuz-* | head -n1)" "$work/vmlinuz"

# Under TCG the bzImage spends 15-60 s decompressing itself (xz, emulated) before the
# kernel prints a line. QEMU boots the uncompressed ELF directly through its PVH entry
# point (the XEN_ELFNOTE_PHYS32_ENTRY note, CONFIG_PVH=y in Debian's kernels) in ~4 s.
# Same approach as the kernel's scripts/extract-vmlinux: try each compression magic.
extract_vmlinux() {
	for fmt in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
		for off in $(LC_ALL=C grep -obUaP "${fmt#*:}" "$work/vmlinuz" | cut -d: -f1); do
			case ${fmt%%:*} in
			xz) tail -c +$((off + 1)) "$work/vmlinuz" | xz -dcq --single-stream >"$work/vmlinux" 2>/dev/null ;;
			zstd) tail -c +$((off + 1)) "$work/vmlinuz" | zstd -dcq >"$work/vmlinux" 2>/dev/null ;;
			gzip) tail -c +$((off + 1)) "$work/vmlinuz" | gzip -dcq >"$work/vmlinux" 2>/dev/null ;;
			esac
			[ "$(head -c 4 "$work/vmlinux" 2>/dev/null)" = "$(printf '\177ELF')" ] && return 0
		done
	done
	rm -f "$work/vmlinux"
	return 1
}
if extract_vmlinux && { ! command -v readelf >/dev/null || readelf -n "$work/vmlinux" | grep -Eq '\(0x00000012\)|PHYS32_ENTRY'; }; then
	:
else
	echo "build.sh: no PVH-bootable vmlinux in $pkg; the guest boots the (slow) bzImage" >&2
	rm -f "$work/vmlinux"
fi

cp "$bb" "$root/bin/busybox"
for a in $("$bb" --list-full); do
	[ -e "$root/$a" ] || ln -s /bin/busybox "$root/$a"
done
for b in "$(command -v iperf3)" "$(command -v ethtool)" "$iping"; do
	cp "$b" "$root/usr/bin/"
	# Every library ldd resolves, at its own path, plus the loader (the line without =>).
	for lib in $(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
done
# Without a console node the kernel starts /init with no stdio; init re-opens it from
# devtmpfs anyway, but early errors would be lost.
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true
echo "root:x:0:0:root:/:/bin/sh" >"$root/etc/passwd"
install -m 755 "$here/init" "$root/init"

# Left uncompressed: 11 MB instead of 4.7 MB, but gunzip under TCG costs a second a boot.
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$work/initrd.img"

# Each file is renamed into place, and the stamp written last, so a reader never boots a
# half-copied file.
rm -f "$cache/stamp"
for f in vmlinux vmlinuz initrd.img; do
	if [ -e "$work/$f" ]; then
		mv "$work/$f" "$cache/$f.new" && mv "$cache/$f.new" "$cache/$f"
	else
		rm -f "$cache/$f"
	fi
done
echo "$pkg" >"$cache/kernel"
echo "$stamp" >"$cache/stamp"
