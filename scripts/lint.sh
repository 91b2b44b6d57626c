#!/usr/bin/env bash
# Lint the module: gofmt, go vet and staticcheck. Run from anywhere.
#
# staticcheck is run via `go run` at a pinned version, so nothing needs to be
# installed beforehand (the module proxy must be reachable on first use).
# 2026.2.2 is module version v0.8.2; it is used as a semver version because the
# proxy does not resolve the year-based tag names (e.g. @2025.1.1).
# Override with STATICCHECK_VERSION=vX.Y.Z if needed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STATICCHECK_VERSION=${STATICCHECK_VERSION:-v0.8.2}

echo "==> gofmt -l ." >&2
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting (run gofmt -w):" >&2
	printf '%s\n' "$unformatted" >&2
	exit 1
fi

echo "==> go vet ./..." >&2
go vet ./...

echo "==> staticcheck ($STATICCHECK_VERSION) ./..." >&2
go run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...

echo "lint: ok" >&2
