#!/usr/bin/env bash
# Lint the library, the CLI module (cmd/backlog), the OpenTelemetry module
# (otelbacklog), the dashboard's browser tests (backlogui/browsertest) and
# the lib/pq tests (backlogtest/internal/pqtest): gofmt, go vet and staticcheck. Run
# from anywhere.
#
# staticcheck is a tool dependency of the tools/ module (pinned in
# tools/go.mod; 2026.2.2 is module version v0.8.2), so the library's go.mod
# never lists it. `go tool` builds it on first use (downloading it through
# the module proxy: the first `make test` on a fresh machine takes a few
# minutes longer) and then takes it from Go's build cache.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."


echo "==> gofmt -l ." >&2
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	printf '%s\n' "$unformatted" >&2
	exit 1
fi

echo "==> go vet ./..." >&2
go vet ./...

echo "==> staticcheck (tools/go.mod) ./..." >&2
staticcheck=$(cd tools && go tool -n staticcheck)
"$staticcheck" ./...

# cmd/backlog is a module of its own (the CLI's dependencies stay out of the
# library's go.mod); ./... above stops at its go.mod, so it is linted here.
# bench/ is not linted (benchmark and soak programs, not shipped).
echo "==> cmd/backlog: go vet ./... and staticcheck ./..." >&2
(cd cmd/backlog && go vet ./... && "$staticcheck" ./...)

# otelbacklog is a module of its own (so the library never depends on
# OpenTelemetry): vet and staticcheck it too.
echo "==> otelbacklog: go vet ./... and staticcheck ./..." >&2
(cd otelbacklog && go vet ./... && "$staticcheck" ./...)

# The dashboard's browser tests are a module of their own (so the library
# never depends on chromedp): vet and staticcheck them too.
echo "==> go vet + staticcheck (backlogui/browsertest) ./..." >&2
(cd backlogui/browsertest && go vet ./... && "$staticcheck" ./...)

# EnqueueTx's tests with lib/pq are a module of their own (so the library
# never depends on lib/pq): vet and staticcheck them too.
echo "==> go vet + staticcheck (backlogtest/internal/pqtest) ./..." >&2
(cd backlogtest/internal/pqtest && go vet ./... && "$staticcheck" ./...)

echo "lint: ok" >&2
