# apt.sh — sourced by build.sh and qemu.sh: apt_download SUITE DIR PKG... fetches Debian
# packages of one suite into DIR without touching the host's apt state or installing
# anything. Debian 12's own suite ("bookworm") uses the host's apt configuration; any
# other suite (bookworm-backports) gets a private source list, package lists and cache
# under $APT_STATE (default /var/tmp/tapgro-apt), so the host's sources and its
# installed packages stay as they are. Each PKG may carry apt's /SUITE or =VERSION.

apt_state=${APT_STATE:-/var/tmp/tapgro-apt}

# apt_opts SUITE prints the apt options for SUITE (none for the host's own).
apt_opts() {
	[ "$1" = bookworm ] && return 0
	# No dpkg status either: with the host's, a package installed here is its own
	# candidate while the suite's lists are missing (registry unreachable), and the
	# host's QEMU 7.2 would be fetched as backports' QEMU.
	printf '%s\n' -o "Dir::Etc::sourcelist=$apt_state/$1.list" -o Dir::Etc::sourceparts=- \
		-o "Dir::State::Lists=$apt_state/lists-$1" -o "Dir::Cache=$apt_state/cache-$1" \
		-o Dir::State::status=/dev/null -o APT::Sandbox::User=root
}

# apt_update SUITE refreshes SUITE's package lists (the private ones for a foreign suite).
apt_update() {
	if [ "$1" != bookworm ]; then
		mkdir -p "$apt_state/lists-$1/partial" "$apt_state/cache-$1/archives/partial"
		# The host's mirror, whatever it is: the first deb.debian.org-style URI it lists.
		uri=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/*$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
		[ -n "$uri" ] || uri=$(sed -n 's/^deb \(http[^ ]*\/debian\)\/* bookworm .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n1)
		[ -n "$uri" ] || uri=http://deb.debian.org/debian
		echo "deb $uri $1 main" >"$apt_state/$1.list"
	fi
	# shellcheck disable=SC2046
	apt-get $(apt_opts "$1") update -q >/dev/null
}

# apt_candidate SUITE PKG prints apt-cache's candidate version of PKG in SUITE's view.
apt_candidate() {
	# shellcheck disable=SC2046
	apt-cache $(apt_opts "$1") policy "$2" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v '(none)' | head -n1
}

# apt_download SUITE DIR PKG... (lists refreshed once if the first try fails).
apt_download() {
	suite=$1 dir=$2
	shift 2
	# shellcheck disable=SC2046
	(cd "$dir" && { apt-get $(apt_opts "$suite") download -q -o APT::Sandbox::User=root "$@" >/dev/null 2>&1 ||
		{ apt_update "$suite" && apt-get $(apt_opts "$suite") download -q -o APT::Sandbox::User=root "$@" >/dev/null; }; })
}
