#!/usr/bin/env bash
# pgbouncer.sh — run a throw-away PgBouncer in transaction pooling mode in
# front of $DATABASE_URL (used by the fault-tolerance suite, make test-faults).
#
# Usage:
#   scripts/pgbouncer.sh                 start PgBouncer, print its URL on stdout
#                                        (one line), then keep it running until
#                                        stdin reaches EOF or INT/TERM arrives
#   scripts/pgbouncer.sh <cmd> [args...] start PgBouncer, run cmd with
#                                        PGBOUNCER_URL set, then stop it
#
# What it does:
#   1. Installs Debian's pgbouncer package with apt-get when the pgbouncer
#      binary is missing. If that install started the system service on port
#      6432, the service is stopped again (this script never uses it).
#   2. Writes a config into a fresh temp dir: pool_mode = transaction,
#      listen_addr = 127.0.0.1 on a free port >= 16432, auth_type = trust with
#      an auth_file listing the user of DATABASE_URL (with its password, which
#      PgBouncer then uses to log in to the server), and one database entry
#      per name pointing at DATABASE_URL's host, port and dbname.
#   3. Starts pgbouncer as a non-root user (PgBouncer refuses to run as root):
#      the `backlogtest` system user that scripts/with-db.sh uses (created if
#      missing) when run as root, else the current user.
#   4. Stops that pgbouncer process (by its pid) and deletes the temp dir on
#      exit, whatever the exit path.
#
# Exit status: the command's status in command mode; 0 after a normal stop;
# 3 when pgbouncer is missing and cannot be installed (callers may skip);
# 1 on any other error. Diagnostics go to stderr.
#
# Environment: DATABASE_URL (a postgres:// URL; default
# postgres://root@127.0.0.1:5432/test?sslmode=disable, like internal/testdb).
set -euo pipefail

prog=pgbouncer.sh
log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { log "error: $*"; exit 1; }
cannot_install() { log "cannot install pgbouncer: $*"; exit 3; }

url=${DATABASE_URL:-postgres://root@127.0.0.1:5432/test?sslmode=disable}

# --- parse DATABASE_URL (postgres[ql]://[user[:password]@]host[:port]/dbname[?params]) ---
re='^postgres(ql)?://(([^:@/]*)(:([^@/]*))?@)?([^:/?]*)(:([0-9]+))?/([^?]*)(\?.*)?$'
[[ "$url" =~ $re ]] || die "DATABASE_URL is not a postgres:// URL this script understands: $url"
userinfo=${BASH_REMATCH[2]:-}
db_user=${BASH_REMATCH[3]:-${PGUSER:-$(id -un)}}
db_pass=${BASH_REMATCH[5]:-}
db_host=${BASH_REMATCH[6]:-127.0.0.1}
db_port=${BASH_REMATCH[8]:-5432}
db_name=${BASH_REMATCH[9]:-$db_user}
[ "$db_host" = localhost ] && db_host=127.0.0.1
# Percent-decoding of user and password (enough for the usual cases).
urldecode() { local s=${1//+/ }; printf '%b' "${s//%/\\x}"; }
db_user=$(urldecode "$db_user")
db_pass=$(urldecode "$db_pass")

# --- install ---
find_pgbouncer() {
	command -v pgbouncer 2>/dev/null && return 0
	[ -x /usr/sbin/pgbouncer ] && { echo /usr/sbin/pgbouncer; return 0; }
	return 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! bin=$(find_pgbouncer); then
	command -v apt-get >/dev/null 2>&1 || cannot_install "no apt-get"
	sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 || cannot_install "not root and no sudo"
		sudo=(sudo -n)
	fi
	system_was_up=0
	port_in_use 6432 && system_was_up=1
	log "installing pgbouncer with apt-get..."
	"${sudo[@]}" apt-get update >&2 || cannot_install "apt-get update failed"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >&2 ||
		cannot_install "apt-get install pgbouncer failed"
	bin=$(find_pgbouncer) || cannot_install "package installed but no pgbouncer binary found"
	# The package may have started its own service on 6432; we do not use it.
	if [ "$system_was_up" = 0 ] && port_in_use 6432; then
		log "stopping the pgbouncer system service the package started"
		"${sudo[@]}" service pgbouncer stop >&2 2>&1 || "${sudo[@]}" systemctl stop pgbouncer >&2 2>&1 || true
	fi
fi

# --- user to run as ---
run_as=()
owner=$(id -un)
if [ "$(id -u)" -eq 0 ]; then
	owner=backlogtest
	if ! id -u "$owner" >/dev/null 2>&1; then
		useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$owner" 2>/dev/null ||
			id -u "$owner" >/dev/null 2>&1 || die "could not create system user $owner"
	fi
	if command -v runuser >/dev/null 2>&1; then
		run_as=(runuser -u "$owner" --)
	else
		run_as=(su "$owner" -s /bin/bash -c)
	fi
fi
as_owner() {
	if [ "${#run_as[@]}" -eq 0 ]; then
		"$@"
	elif [ "${run_as[0]}" = su ]; then
		"${run_as[@]}" "$(printf '%q ' "$@")"
	else
		"${run_as[@]}" "$@"
	fi
}

# --- temp dir, config ---
dir=""
pid=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
	fi
	[ -n "$dir" ] && rm -rf -- "$dir"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

dir=$(mktemp -d /tmp/backlog-pgbouncer.XXXXXX)
[ "$owner" != "$(id -un)" ] && chown "$owner:" "$dir"

port=16432
while port_in_use "$port"; do
	port=$((port + 1))
	[ "$port" -le 65535 ] || die "no free port from 16432 up"
done

# auth_file lines: "user" "password" (double quotes inside doubled).
q() { printf '"%s"' "${1//\"/\"\"}"; }
printf '%s %s\n' "$(q "$db_user")" "$(q "$db_pass")" >"$dir/userlist.txt"
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$db_name = host=$db_host port=$db_port dbname=$db_name

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 10
reserve_pool_size = 0
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
[ "$owner" != "$(id -un)" ] && chown -R "$owner:" "$dir"

# --- start (retry with the next port if another process took ours) ---
attempts=0
while :; do
	if (cd "$dir" && as_owner "$bin" -d "$dir/pgbouncer.ini") >/dev/null 2>&1; then
		for _ in $(seq 100); do
			[ -s "$dir/pgbouncer.pid" ] && port_in_use "$port" && break
			sleep 0.05
		done
	fi
	if [ -s "$dir/pgbouncer.pid" ]; then
		pid=$(cat "$dir/pgbouncer.pid")
		kill -0 "$pid" 2>/dev/null && port_in_use "$port" && break
	fi
	attempts=$((attempts + 1))
	if [ "$attempts" -ge 5 ]; then
		cat "$dir/pgbouncer.log" >&2 2>/dev/null || true
		die "pgbouncer did not start"
	fi
	port=$((port + 1))
	while port_in_use "$port"; do port=$((port + 1)); done
	sed -i "s/^listen_port = .*/listen_port = $port/" "$dir/pgbouncer.ini"
done

bouncer_url="postgres://${userinfo}127.0.0.1:$port/$db_name?sslmode=disable"
# Check that a query goes through (PgBouncer logs in to the server lazily).
if command -v psql >/dev/null 2>&1; then
	ok=0
	for _ in $(seq 50); do
		if PGCONNECT_TIMEOUT=3 psql -X -w -q "$bouncer_url" -Atc 'select 1' >/dev/null 2>&1; then
			ok=1
			break
		fi
		sleep 0.1
	done
	if [ "$ok" = 0 ]; then
		cat "$dir/pgbouncer.log" >&2 2>/dev/null || true
		die "pgbouncer is up on port $port but a query through it fails"
	fi
fi
log "pgbouncer $("$bin" --version 2>/dev/null | head -n1 | awk '{print $NF}') (pid $pid, transaction pooling) at $bouncer_url -> $db_host:$db_port/$db_name"

if [ "$#" -gt 0 ]; then
	status=0
	PGBOUNCER_URL=$bouncer_url "$@" || status=$?
	exit "$status"
fi
printf '%s\n' "$bouncer_url"
# Keep running until stdin closes; `wait` lets the INT/TERM traps run at once.
# (A background command's stdin would be /dev/null without the redirection.)
cat <&0 >/dev/null &
wait $! || true
exit 0
