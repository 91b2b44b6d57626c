#!/usr/bin/env bash
# test-all.sh — run the test suite of every module of the repository, each
# to its end whatever the others did, then print a summary and exit
# non-zero if any failed. make test runs it under scripts/with-db.sh (one
# database for all modules).
#
# Usage: scripts/test-all.sh [go test flags...]   (default: -race -count=1)
# The modules: the library (with backlogtest, backlogui, faults, examples),
# cmd/backlog, otelbacklog and backlogtest/internal/pqtest.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-race -count=1)

failed=()
run() { # run NAME DIR TIMEOUT
	local name=$1 dir=$2 timeout=$3
	echo "==> $name: go test ${flags[*]} -timeout $timeout ./..." >&2
	if ! (cd "$dir" && "$GO" test "${flags[@]}" -timeout "$timeout" ./...); then
		failed+=("$name")
	fi
}

run library . 15m
run cmd/backlog cmd/backlog 8m
run otelbacklog otelbacklog 5m
run backlogtest/internal/pqtest backlogtest/internal/pqtest 5m

if [ ${#failed[@]} -gt 0 ]; then
	echo "" >&2
	echo "!!! FAILED: ${failed[*]} (the other modules passed; see above)" >&2
	exit 1
fi
echo "test-all: every module passed" >&2
