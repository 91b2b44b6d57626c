// Package faults holds backlog's fault-tolerance suite (package faults_test):
// worker processes killed with SIGKILL, database backends terminated, TCP
// connections cut, slowed down or blackholed by an in-test proxy, the LISTEN
// connection lost, PgBouncer in transaction pooling mode, bad input under
// load, and a randomized stress test mixing all of it (TestStress; see
// BACKLOG_STRESS_SEED and BACKLOG_STRESS_DURATION). Every scenario runs against a real PostgreSQL, stops by
// itself, and ends with exact accounting of every job it enqueued.
//
// The suite is slow, so it runs only when BACKLOG_FAULTS=1 (make
// test-faults); otherwise every test skips. The high-availability
// scenarios (TestHAFailover, TestHAMixed: a pg_auto_failover cluster, a
// killed primary and a switchover) run only when BACKLOG_HA=1 (make
// test-ha; see docs/high-availability.md).
package faults
