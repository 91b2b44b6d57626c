# backlog — the two commands a newcomer needs:
#   make demo   runs examples/quickstart against a real PostgreSQL
#   make test   runs the whole test suite (-race) against a real PostgreSQL
# Both use $DATABASE_URL, else the server on 127.0.0.1:5432 if it answers,
# else a throw-away cluster (scripts/with-db.sh).

GO ?= go
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

.PHONY: test test-short lint api demo cli bench bench-quick soak measure test-faults

# Every module is tested to its end whatever the others did
# (scripts/test-all.sh), and the target fails at the end if any did.
test: lint
	GO=$(GO) scripts/with-db.sh scripts/test-all.sh
ifneq ($(BACKLOG_FAULTS),1)
	@echo "note: faults/ was compiled but its scenarios were SKIPPED (BACKLOG_FAULTS is not 1); run make test-faults"
endif

test-short:
	GO=$(GO) scripts/with-db.sh scripts/test-all.sh -race -count=1 -short

lint:
	scripts/lint.sh

# Regenerates api/backlog.txt and api/otelbacklog.txt, the records of the
# exported API that make test checks (internal/apicheck;
# docs/compatibility.md). It refuses to record an API change unless
# CHANGELOG.md's "## Unreleased" section changed too; run it again after
# any edit of that section.
api:
	$(GO) run ./internal/apicheck/apirecord

demo:
	scripts/with-db.sh $(GO) run ./examples/quickstart

# The backlog command (cmd/backlog, its own module) into bin/backlog.
cli:
	cd cmd/backlog && $(GO) build -o ../../bin/backlog .

# Benchmarks (bench/ is its own module, so the library never depends on River):
#   make bench        full run: backlog vs River (default and tuned) vs graphile-worker vs a raw-SQL floor (about 23 minutes)
#   make bench-quick  the same workloads, smaller and shorter (about 2.5 minutes)
# Both print a markdown table and write it to bench/results/latest.md.
bench:
	cd bench && ../scripts/with-db.sh $(GO) run ./cmd/bench

bench-quick:
	cd bench && ../scripts/with-db.sh $(GO) run ./cmd/bench -quick

# Scaling out (bench/cmd/scale): 1, 2, 4, 8, 16 and 32 worker processes
# (each its own pool, default settings) on one database: burn-down, fixed
# offered load, idle cost, connections held; medians of 3 runs (about 17
# minutes). A throw-away cluster of its own (max_connections 200: 32
# processes hold about 160 connections), never the shared server on 5432.
# Writes bench/results/scale.md. Flags through SCALE_FLAGS.
.PHONY: scale
scale:
	cd bench && BACKLOG_TEST_NO_LOCAL=1 ../scripts/with-db.sh $(GO) run ./cmd/scale $(SCALE_FLAGS)

# Soak (bench/cmd/soak): backlog at 5,000 jobs/s for 30 minutes, then again with
# a REPEATABLE READ transaction held from minute 12 to 17 (about 62 minutes in
# all). Writes bench/results/soak.md. Flags through SOAK_FLAGS, e.g.
#   make soak SOAK_FLAGS=-quick                 (5-minute phases, about 11 minutes)
#   make soak SOAK_FLAGS='-phases hold'
# Not part of make test.
soak:
	cd bench && ../scripts/with-db.sh $(GO) run ./cmd/soak $(SOAK_FLAGS)

# Measurements (not tests): a periodic tick, a cleaner pass, Stats and Job
# with 1M finished jobs; enqueue throughput with and without NOTIFY; a
# burn-down of 100k jobs (CPU and allocations per job); pickup latency at
# 1,000 jobs/s (BACKLOG_LATENCY_RATE=100 for another rate) and where it goes
# (commit → claim statement → handler, TestMeasurePickupStages); the dashboard's
# page times with 1M finished jobs (backlogui).
measure:
	BACKLOG_MEASURE=1 scripts/with-db.sh $(GO) test -count=1 -run 'TestMeasure' -v . | grep -E 'measure_test|ok|FAIL'
	BACKLOG_MEASURE=1 scripts/with-db.sh $(GO) test -count=1 -timeout 20m -run 'TestMeasure' -v ./backlogui/ | grep -E 'measure_test|ok|FAIL'

# Fault-tolerance suite (faults/): SIGKILLed worker processes, terminated
# backends, cut/slow/blackholed connections (in-test TCP proxy), LISTEN loss,
# PgBouncer in transaction pooling (scripts/pgbouncer.sh installs and runs it),
# bad input under load, a read pool on a streaming hot standby (pg_basebackup -R),
# and a randomized stress test (BACKLOG_STRESS_SEED replays
# a run's workload, BACKLOG_STRESS_DURATION lengthens it). About 4 minutes;
# `make test` skips it (BACKLOG_FAULTS unset).
.PHONY: test-faults
test-faults:
	BACKLOG_FAULTS=1 scripts/with-db.sh $(GO) test -race -count=1 -v -timeout 15m ./faults/

# High-availability failover (faults/ha_test.go, faults/ha_mixed_test.go,
# internal/hacluster): a pg_auto_failover monitor and three data nodes
# (number_sync_standbys 1: every commit is on a standby before it is
# acknowledged) on free loopback ports in a temporary directory, brought
# up by each test itself; the primary's node is killed with SIGKILL, then
# a switchover. scripts/ha.sh install puts pg_auto_failover on the machine
# (apt-get, as root) when it is missing. The clusters do not use
# DATABASE_URL; TestHAMixed keeps its execution log there (scripts/with-db.sh).
# BACKLOG_HA_SEED replays TestHAMixed's workload. Two clusters brought up,
# four failovers: 7 to 9 minutes measured on a loaded 2-core machine. make test-ha-cluster tests the
# harness alone (internal/hacluster: also a kill -9 of the postmaster
# alone, which pg_autoctl restarts in place: a crash, not a failover).
.PHONY: test-ha test-ha-cluster
test-ha:
	@scripts/ha.sh install || { rc=$$?; echo "!!! make test-ha: pg_auto_failover is missing and could not be installed: HA tests SKIPPED" >&2; [ -z "$$BACKLOG_CI" ] || exit 1; [ $$rc -eq 3 ] || exit $$rc; }
	BACKLOG_HA=1 scripts/with-db.sh $(GO) test -race -count=1 -v -timeout 15m -run 'TestHA' ./faults/

test-ha-cluster:
	scripts/ha.sh install
	BACKLOG_HA=1 $(GO) test -race -count=1 -v -timeout 15m -run 'TestCluster' ./internal/hacluster/

# Dashboard browser tests (backlogui/browsertest, its own module so the
# library never depends on chromedp): a seeded queue driven in headless
# Chromium, installed by scripts/chromium.sh when missing. Screenshots of
# every page, light and dark, go to backlogui/browsertest/artifacts/
# (git-ignored). About a minute. Without a browser they are skipped with a
# loud message (a failure under BACKLOG_CI=1).
.PHONY: test-ui ui-screenshots
test-ui:
	@browser=$$(scripts/chromium.sh) || { echo "!!! make test-ui: no Chromium could be found or installed: browser tests SKIPPED" >&2; [ -z "$$BACKLOG_CI" ] || exit 1; exit 0; }; \
	cd backlogui/browsertest && BACKLOG_CHROMIUM=$$browser ../../scripts/with-db.sh $(GO) test -count=1 -v -timeout 5m .

# Regenerates the dashboard screenshots of docs/dashboard-reference.md (docs/overview.png,
# docs/job.png) by running the browser tests.
ui-screenshots:
	@browser=$$(scripts/chromium.sh) || { echo "make ui-screenshots: no Chromium" >&2; exit 1; }; \
	cd backlogui/browsertest && BACKLOG_CHROMIUM=$$browser BACKLOG_UI_DOCS=$(CURDIR)/docs ../../scripts/with-db.sh $(GO) test -count=1 -timeout 5m .
