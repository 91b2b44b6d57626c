#!/usr/bin/env bash
# chromium.sh — print the path of a headless-capable Chromium, installing
# Debian's `chromium` package with apt-get when none is found (as root, or
# through sudo), like with-db.sh installs PostgreSQL.
#
# Usage: scripts/chromium.sh        prints the browser's path on stdout
# Exit status 1 (with the reason on stderr) when no browser can be had; the
# browser tests then skip with a loud message (or fail under BACKLOG_CI=1).
set -euo pipefail

prog=chromium.sh
log() { printf '%s: %s\n' "$prog" "$*" >&2; }

find_browser() {
	local b
	for b in chromium chromium-browser google-chrome google-chrome-stable headless_shell; do
		if command -v "$b" >/dev/null 2>&1; then
			command -v "$b"
			return 0
		fi
	done
	return 1
}

if find_browser; then
	exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		log "no chromium found and installing it needs root (no passwordless sudo)"
		exit 1
	fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
	log "no chromium found and no apt-get to install it with"
	exit 1
fi
log "installing chromium with apt-get (once; takes a minute)"
"${sudo[@]}" apt-get update >&2 || { log "apt-get update failed"; exit 1; }
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-dejavu-core >&2 ||
	{ log "apt-get install chromium failed"; exit 1; }
find_browser || { log "chromium installed but not found on PATH"; exit 1; }
