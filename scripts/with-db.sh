#!/usr/bin/env bash
# with-db.sh — run a command with DATABASE_URL pointing at a usable PostgreSQL.
#
# Usage: scripts/with-db.sh <command> [args...]
#   e.g. scripts/with-db.sh go test -race ./...
#
# DATABASE_URL is chosen in this order:
#   1. DATABASE_URL from the environment, if set and non-empty (used as is).
#   2. A server answering on 127.0.0.1:5432, trying in order
#        postgres://root@127.0.0.1:5432/test?sslmode=disable
#        postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
#        postgres://root@127.0.0.1:5432/postgres?sslmode=disable
#      and using the first one where `psql -c 'select 1'` succeeds
#      (needs psql; without psql this step is skipped).
#   3. A throw-away cluster: initdb into a fresh temp dir, started on a free
#      port >= 55432 (listening on 127.0.0.1 only), stopped and deleted when
#      this script exits (normally, on error, or on INT/TERM). PostgreSQL server
#      binaries are taken from /usr/lib/postgresql/<highest version>/bin and
#      installed with apt-get if absent. When run as root, the cluster runs as
#      the system user `backlogtest` (created if missing).
#
# Environment variables:
#   DATABASE_URL            see step 1.
#   BACKLOG_TEST_NO_LOCAL=1 skip step 2 (never use the server on port 5432);
#                           forces a throw-away cluster unless DATABASE_URL is set.
#
# The command's exit status is the script's exit status. A line naming the
# database used goes to stderr, plus a warning if max_connections < 100.
set -euo pipefail

prog=with-db.sh
log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { log "error: $*"; exit 1; }

if [ "$#" -eq 0 ]; then
	die "usage: $0 <command> [args...]"
fi

# Throw-away cluster state (empty unless step 3 runs).
pg_tmpdir=""
pg_bindir=""
pg_user=""    # non-empty when the cluster runs as another user (we are root)
cleaned_up=0

# Run a command as the cluster owner.
as_pg_user() {
	if [ -z "$pg_user" ]; then
		"$@"
	elif command -v runuser >/dev/null 2>&1; then
		runuser -u "$pg_user" -- "$@"
	else
		su "$pg_user" -s /bin/bash -c "$(printf '%q ' "$@")"
	fi
}

cleanup() {
	[ "$cleaned_up" = 1 ] && return 0
	cleaned_up=1
	[ -n "$pg_tmpdir" ] || return 0
	local data="$pg_tmpdir/data"
	if [ -f "$data/postmaster.pid" ]; then
		# Run from the temp dir: the cluster user may not be able to read $PWD.
		(cd "$pg_tmpdir" && as_pg_user "$pg_bindir/pg_ctl" -D "$data" -m immediate -w stop) >/dev/null 2>&1 || true
		# Belt and braces: if the postmaster is still alive, kill it.
		if [ -f "$data/postmaster.pid" ]; then
			local pid
			pid=$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)
			if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
				kill -KILL "$pid" 2>/dev/null || true
				sleep 0.2
			fi
		fi
	fi
	rm -rf -- "$pg_tmpdir"
}
trap cleanup EXIT
trap 'exit 130' INT   # `exit` runs the EXIT trap
trap 'exit 143' TERM

# Does anything accept TCP connections on 127.0.0.1:$1?
port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# psql_ok URL — can we connect and run a query?
psql_ok() {
	PGCONNECT_TIMEOUT=3 psql -X -w -q "$1" -Atc 'select 1' >/dev/null 2>&1
}

find_local_server() {
	command -v psql >/dev/null 2>&1 || return 1
	if command -v pg_isready >/dev/null 2>&1; then
		# 0 = accepting, 1 = rejecting (e.g. starting up); 2/3 = nothing there.
		local rc=0
		pg_isready -q -h 127.0.0.1 -p 5432 -t 3 >/dev/null 2>&1 || rc=$?
		[ "$rc" -le 1 ] || return 1
	else
		port_in_use 5432 || return 1
	fi
	local url
	for url in \
		'postgres://root@127.0.0.1:5432/test?sslmode=disable' \
		'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' \
		'postgres://root@127.0.0.1:5432/postgres?sslmode=disable'; do
		if psql_ok "$url"; then
			printf '%s\n' "$url"
			return 0
		fi
	done
	return 1
}

# Print the highest-versioned /usr/lib/postgresql/*/bin holding server binaries.
find_server_bindir() {
	local d best=""
	while IFS= read -r d; do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
			best=$d
		fi
	done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -V)
	[ -n "$best" ] || return 1
	printf '%s\n' "$best"
}

install_server() {
	command -v apt-get >/dev/null 2>&1 ||
		die "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin and no apt-get to install them; set DATABASE_URL"
	local sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 ||
			die "PostgreSQL server binaries are missing and installing them needs root (no sudo found); install the 'postgresql' package or set DATABASE_URL"
		sudo=(sudo)
	fi
	log "installing PostgreSQL server binaries with apt-get..."
	"${sudo[@]}" apt-get update >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2
}

start_throwaway_cluster() {
	pg_bindir=$(find_server_bindir) || {
		install_server
		pg_bindir=$(find_server_bindir) || die "apt-get installed postgresql but no server binaries found in /usr/lib/postgresql/*/bin"
	}

	if [ "$(id -u)" -eq 0 ]; then
		pg_user=backlogtest
		if ! id -u "$pg_user" >/dev/null 2>&1; then
			useradd --system --no-create-home --home-dir /nonexistent \
				--shell /usr/sbin/nologin "$pg_user" 2>/dev/null ||
				id -u "$pg_user" >/dev/null 2>&1 || # lost a race with a parallel run?
				die "could not create system user $pg_user"
		fi
	fi

	pg_tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/backlog-pg.XXXXXX")
	if [ -n "$pg_user" ]; then
		chown "$pg_user:" "$pg_tmpdir"
		if ! as_pg_user test -w "$pg_tmpdir"; then
			# $TMPDIR is not reachable by the cluster user; fall back to /tmp.
			rm -rf -- "$pg_tmpdir"
			pg_tmpdir=$(mktemp -d /tmp/backlog-pg.XXXXXX)
			chown "$pg_user:" "$pg_tmpdir"
		fi
	fi
	local data="$pg_tmpdir/data" logfile="$pg_tmpdir/postgres.log"

	if ! (cd "$pg_tmpdir" && as_pg_user "$pg_bindir/initdb" -D "$data" --auth=trust -U postgres \
		--no-sync -E UTF8 --locale=C.UTF-8 >"$pg_tmpdir/initdb.log" 2>&1) &&
		! (cd "$pg_tmpdir" && rm -rf -- "$data" && as_pg_user "$pg_bindir/initdb" -D "$data" --auth=trust -U postgres \
			--no-sync -E UTF8 --locale=C >"$pg_tmpdir/initdb.log" 2>&1); then
		cat "$pg_tmpdir/initdb.log" >&2 || true
		die "initdb failed"
	fi

	# Pick a free port from 55432 up; retry a few times in case another process
	# grabs the port between the check and the server's bind.
	local port=55432 attempts=0
	while :; do
		while port_in_use "$port"; do
			port=$((port + 1))
			[ "$port" -le 65535 ] || die "no free TCP port found from 55432 up"
		done
		if (cd "$pg_tmpdir" && as_pg_user "$pg_bindir/pg_ctl" -D "$data" -l "$logfile" -w -t 60 \
			-o "-k '$pg_tmpdir' -p $port -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
			start) >/dev/null 2>&1; then
			break
		fi
		attempts=$((attempts + 1))
		if [ "$attempts" -ge 5 ] || ! grep -q 'could not \(bind\|create listen\)' "$logfile" 2>/dev/null; then
			log "pg_ctl start failed; server log follows:"
			cat "$logfile" >&2 2>/dev/null || true
			die "could not start throw-away PostgreSQL cluster"
		fi
		: >"$logfile"
		port=$((port + 1))
	done

	DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	log "using throw-away PostgreSQL ($(basename "$(dirname "$pg_bindir")")) at $DATABASE_URL (data in $pg_tmpdir, removed on exit)"
}

# mask_url prints a connection URL with its password replaced by ***.
mask_url() {
	printf '%s\n' "$1" | sed -E 's#^([a-z]+://[^:/@]*:)[^@]*@#\1***@#'
}

if [ -n "${DATABASE_URL:-}" ]; then
	log "using DATABASE_URL from environment: $(mask_url "$DATABASE_URL")"
elif [ "${BACKLOG_TEST_NO_LOCAL:-}" != 1 ] && url=$(find_local_server); then
	DATABASE_URL=$url
	log "using local PostgreSQL at $DATABASE_URL"
else
	start_throwaway_cluster
fi
export DATABASE_URL

if command -v psql >/dev/null 2>&1; then
	if maxconn=$(PGCONNECT_TIMEOUT=3 psql -X -w "$DATABASE_URL" -Atc 'show max_connections' 2>/dev/null) &&
		[[ "$maxconn" =~ ^[0-9]+$ ]]; then
		if [ "$maxconn" -lt 100 ]; then
			log "warning: max_connections is $maxconn (< 100); parallel tests may run out of connections"
		fi
	else
		log "warning: could not query max_connections via $(mask_url "$DATABASE_URL")"
	fi
fi

status=0
"$@" || status=$?
exit "$status"
