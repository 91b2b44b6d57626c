#!/usr/bin/env bash
# ha.sh — what the high-availability failover tests (faults/ha_test.go,
# make test-ha) need from the machine.
#
# Usage:
#   scripts/ha.sh install   installs pg_auto_failover (Debian packages
#                           postgresql-<N>-auto-failover and
#                           pg-auto-failover-cli, N the newest server in
#                           /usr/lib/postgresql) unless pg_autoctl and the
#                           extension are there already; idempotent
#   scripts/ha.sh check     exits 0 when they are there, 3 when not
#
# The clusters themselves are brought up and torn down by the Go harness
# (internal/hacluster): a monitor and three data nodes in a temporary
# directory, on free loopback ports, run as the `backlogtest` system user
# when the tests run as root. This script never touches a running
# PostgreSQL: installing the two packages starts no service and creates no
# cluster (apt-get is told to install nothing else and upgrade nothing).
#
# Installing needs root, or sudo. Exit status: 0 on success; 3 when the
# packages are missing and cannot be installed (not root and no sudo, no
# apt-get, apt-get failed: callers may skip); 1 on other errors.
set -euo pipefail

prog=ha.sh
log() { printf '%s: %s\n' "$prog" "$*" >&2; }

# The newest PostgreSQL server version installed (its pg_auto_failover
# extension must match it).
pg_version() {
	local v best=
	for d in /usr/lib/postgresql/*/bin/postgres; do
		[ -x "$d" ] || continue
		v=$(basename "$(dirname "$(dirname "$d")")")
		if [ -z "$best" ] || [ "$v" -gt "$best" ]; then best=$v; fi
	done
	[ -n "$best" ] || { log "no PostgreSQL server in /usr/lib/postgresql/*/bin (install postgresql)"; exit 3; }
	echo "$best"
}

present() {
	local v=$1
	{ command -v pg_autoctl >/dev/null || [ -x /usr/bin/pg_autoctl ]; } &&
		[ -f "/usr/share/postgresql/$v/extension/pgautofailover.control" ]
}

cmd=${1:-}
case "$cmd" in
check)
	v=$(pg_version)
	present "$v" || exit 3
	;;
install)
	if v=$(pg_version 2>/dev/null) && present "$v"; then
		log "pg_auto_failover for PostgreSQL $v already installed"
		exit 0
	fi
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null || { log "pg_auto_failover is missing and installing it needs root (no sudo found)"; exit 3; }
		sudo=(sudo -n env DEBIAN_FRONTEND=noninteractive)
	fi
	command -v apt-get >/dev/null || { log "pg_auto_failover is missing and there is no apt-get"; exit 3; }
	export DEBIAN_FRONTEND=noninteractive
	log "apt-get update"
	"${sudo[@]}" apt-get update -qq >&2 || { log "apt-get update failed"; exit 3; }
	if ! pg_version >/dev/null 2>&1; then
		# A fresh machine (the tests' server may be $DATABASE_URL's,
		# elsewhere): the PostgreSQL server binaries the nodes run.
		log "apt-get install postgresql"
		"${sudo[@]}" apt-get install -y -qq --no-install-recommends --no-upgrade postgresql >&2 ||
			{ log "apt-get install postgresql failed"; exit 3; }
	fi
	v=$(pg_version)
	log "apt-get install postgresql-$v-auto-failover pg-auto-failover-cli"
	"${sudo[@]}" apt-get install -y -qq --no-install-recommends --no-upgrade \
		"postgresql-$v-auto-failover" pg-auto-failover-cli >&2 ||
		{ log "apt-get install failed"; exit 3; }
	present "$v" || { log "installed, but pg_autoctl or the pgautofailover extension is still missing"; exit 1; }
	log "pg_auto_failover installed: $(pg_autoctl version 2>&1 | head -1)"
	;;
*)
	echo "usage: $prog install|check" >&2
	exit 2
	;;
esac
