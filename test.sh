#!/usr/bin/env bash
# tapgro's one test command (README "Testing"; CI runs exactly this).
# As root on Debian 12 it first installs what the tests use, then it checks formatting,
# vets, and runs every test with the privileged ones made mandatory.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

if [ "$(id -u)" = 0 ]; then
	pkgs="systemd iproute2 iputils-ping iperf3 ethtool tcpdump procps qemu-system-x86 busybox-static cpio socat xz-utils zstd"
	missing=""
	for p in $pkgs; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
	done
	if [ -n "$missing" ]; then
		echo "== installing:$missing"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
	fi
	# Root can run every test, so none may skip silently (see integration/netnstest).
	export TAPGRO_REQUIRE_PRIV=1
fi

echo "== gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== go test"
go test -count=1 -race -timeout 40m ./... "$@"
echo "== go test -tags tapgro_unlogged_rx (the migration tests' control build)"
go test -count=1 -tags tapgro_unlogged_rx -run UnloggedControl ./vhostnet/
