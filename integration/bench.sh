#!/usr/bin/env bash
# integration/bench.sh — throughput of tapgro beside the kernel's own path, in one run.
#
# Usage (root): integration/bench.sh [-t SECONDS] [-r REPEATS] [-m MTU] [CASE...]
# Cases: veth, gro-on, gro-off, gro-timer, vhost-user (default: veth gro-on gro-off)
#
# Topology for the tapgro cases (the emulated guest is the "a" side: its TAP keeps TSO on, so
# its tapgro reads 64 KB frames and segments them in software exactly as it must for a
# QEMU guest behind -netdev stream; the link between the two tapgro carries MTU frames):
#
#   ns a: 198.18.0.1 ─ tg0 ─ tapgro ══ stream (unix) ══ tapgro ─ tg0 ─ 198.18.0.2 :ns b
#
# "a->b" is the guest->host direction: b's tapgro coalesces. "b->a" is host->guest: b's
# tapgro segments, a's coalesces. The veth case joins the same two namespaces directly.
# The vhost-user case puts the bench front-end (integration/vhostrelay, relaying between
# tapgro's vhost-user rings and a TAP of its own) on side a and tapgro --netdev vhost-user
# on side b; its "tapgro a" column is the front-end's CPU.
# Each case runs REPEATS times per direction; the table shows median/min/max Gbit/s, the
# ratio of the median to the first case's, and CPU seconds per GB moved for each tapgro.
set -euo pipefail

secs=5 reps=3 mtu=1500
while getopts "t:r:m:" o; do
	case $o in
	t) secs=$OPTARG ;;
	r) reps=$OPTARG ;;
	m) mtu=$OPTARG ;;
	*) sed -n 2,20p "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(veth gro-on gro-off)

[ "$(id -u)" = 0 ] || { echo "bench.sh: needs root" >&2; exit 2; }
for c in ip iperf3; do command -v $c >/dev/null || { echo "bench.sh: needs $c" >&2; exit 2; }; done
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
work=$(mktemp -d /tmp/tapgro-bench.XXXXXX)
bin=$work/tapgro
go build -o "$bin" .
relay=$work/vhostrelay
go build -o "$relay" ./integration/vhostrelay
tag=$$
nsa=tapgro-bench-$tag-a nsb=tapgro-bench-$tag-b
pids=()

cleanup() {
	for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	ip netns del "$nsa" 2>/dev/null || true
	ip netns del "$nsb" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

mkns() {
	ip netns del "$nsa" 2>/dev/null || true
	ip netns del "$nsb" 2>/dev/null || true
	ip netns add "$nsa"
	ip netns add "$nsb"
	ip -n "$nsa" link set lo up
	ip -n "$nsb" link set lo up
}

# cpu_ticks PID: utime+stime in clock ticks.
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# start_tapgro NS NAME ARGS...: starts tapgro in NS; its PID is left in $started
# (not printed: a command substitution would run it in a subshell that forgets it).
start_tapgro() {
	local ns=$1 name=$2
	shift 2
	ip netns exec "$ns" "$bin" "$@" >"$work/$name.log" 2>&1 &
	started=$!
	pids+=("$started")
}

stop_all() {
	for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	pids=()
}

wait_ping() {
	for _ in $(seq 100); do
		ip netns exec "$nsa" ping -c1 -W1 198.18.0.2 >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "no ping across the bridge" >&2
	cat "$work"/*.log >&2
	return 1
}

setup_case() {
	mkns
	case $1 in
	veth)
		ip link add vb0 netns "$nsa" mtu "$mtu" type veth peer name vb1 netns "$nsb" mtu "$mtu"
		ip -n "$nsa" addr add 198.18.0.1/24 dev vb0
		ip -n "$nsb" addr add 198.18.0.2/24 dev vb1
		ip -n "$nsa" link set vb0 up
		ip -n "$nsb" link set vb1 up
		pida="" pidb=""
		;;
	gro-on | gro-off | gro-timer)
		local extra=()
		[ "$1" = gro-off ] && extra=(--gro off)
		[ "$1" = gro-timer ] && extra=(--gro-flush timer)
		local sock=$work/s.sock
		start_tapgro "$nsa" a --tap tg0 --mtu "$mtu" --addr 198.18.0.1/24 "${extra[@]}" \
			--netdev "stream,server=on,addr.type=unix,addr.path=$sock"
		pida=$started
		sleep 0.3
		start_tapgro "$nsb" b --tap tg0 --mtu "$mtu" --addr 198.18.0.2/24 "${extra[@]}" \
			--netdev "stream,server=off,addr.type=unix,addr.path=$sock"
		pidb=$started
		;;
	vhost-user)
		local vsock=$work/vu.sock
		start_tapgro "$nsb" b --tap tg0 --mtu "$mtu" --addr 198.18.0.2/24 --netdev "vhost-user,path=$vsock"
		pidb=$started
		# The front-end waits for tapgro's socket itself.
		ip netns exec "$nsa" "$relay" -connect "$vsock" -tap vr0 -addr 198.18.0.1/24 -mtu "$mtu" >"$work/a.log" 2>&1 &
		pida=$!
		pids+=("$pida")
		;;
	*) echo "unknown case $1" >&2; exit 2 ;;
	esac
	wait_ping
}

# run_iperf DIR -> prints Gbit/s
run_iperf() {
	local rev=()
	[ "$1" = "b->a" ] && rev=(-R)
	ip netns exec "$nsb" iperf3 -s -1 -B 198.18.0.2 >/dev/null 2>&1 &
	local srv=$!
	sleep 0.2
	local out
	out=$(ip netns exec "$nsa" iperf3 -c 198.18.0.2 -t "$secs" "${rev[@]}" -J)
	wait $srv 2>/dev/null || true
	echo "$out" | python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
}

stats() { # values... -> "median min max"
	printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "%.2f %.2f %.2f", m, v[1], v[NR]}'
}

hz=$(getconf CLK_TCK)
printf '# tapgro bench: %s, kernel %s, %s cores, MTU %s, %s s x %s runs per row\n' \
	"$(date -u +%FT%TZ)" "$(uname -r)" "$(nproc)" "$mtu" "$secs" "$reps"
printf '| case | direction | median Gbit/s | min | max | ratio | tapgro a CPU s/GB | tapgro b CPU s/GB |\n'
printf '|---|---|---|---|---|---|---|---|\n'
first=""
for c in "${cases[@]}"; do
	for dir in "a->b" "b->a"; do
		setup_case "$c"
		vals=()
		ca0=0 cb0=0
		[ -n "$pida" ] && ca0=$(cpu_ticks "$pida") && cb0=$(cpu_ticks "$pidb")
		for _ in $(seq "$reps"); do vals+=("$(run_iperf "$dir")"); done
		cpua="-" cpub="-"
		if [ -n "$pida" ]; then
			ca1=$(cpu_ticks "$pida") cb1=$(cpu_ticks "$pidb")
			# GB moved: sum of Gbit/s * secs / 8
			gb=$(printf '%s\n' "${vals[@]}" | awk -v s="$secs" '{g+=$1*s/8} END {print g}')
			cpua=$(awk -v d=$((ca1 - ca0)) -v hz="$hz" -v gb="$gb" 'BEGIN {printf "%.2f", d/hz/gb}')
			cpub=$(awk -v d=$((cb1 - cb0)) -v hz="$hz" -v gb="$gb" 'BEGIN {printf "%.2f", d/hz/gb}')
		fi
		read -r med lo hi <<<"$(stats "${vals[@]}")"
		key="$dir"
		eval "base=\${first_$([ "$dir" = "a->b" ] && echo ab || echo ba):-}"
		if [ -z "$base" ]; then
			eval "first_$([ "$dir" = "a->b" ] && echo ab || echo ba)=$med"
			base=$med
		fi
		ratio=$(awk -v m="$med" -v b="$base" 'BEGIN {printf "%.2f", (b>0)?m/b:0}')
		printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$c" "$key" "$med" "$lo" "$hi" "$ratio" "$cpua" "$cpub"
		stop_all
	done
done
