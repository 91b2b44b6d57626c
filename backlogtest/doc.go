// Package backlogtest helps an application's own tests check what its code
// enqueued and run its handlers, against a real PostgreSQL and without
// sleeps.
//
//   - NewQueue gives a test a Queue in a schema of its own, migrated, and
//     closed and dropped when the test ends, so tests run in parallel
//     (t.Parallel) against one database.
//   - RequireEnqueued, RequireEnqueuedTx, RequireNotEnqueued and
//     RequireManyEnqueued assert what was enqueued (type, args, tags, keys,
//     priority, run_at window, state); a failure lists what was enqueued
//     instead. The …Tx forms read through a transaction of the
//     application's, any that backlog.Tx lists (pgx.Tx, *sql.Tx, …). Args decodes a job's args into the application's type.
//   - RequireEnqueuedArgs, RequireEnqueuedArgsTx, RequireNotEnqueuedArgs and
//     EnqueuedArgs do the same for typed jobs (backlog.JobArgs): the kind
//     comes from the args type, and the jobs come back with their args
//     decoded into it (a job whose args do not decode fails the test).
//   - Work runs a handler on one given job, inline, through the same claim
//     (under a lease token), outcome handling and fenced finish as
//     Queue.Work, and returns the outcome and the recorded job.
//     DrainUntilIdle works every due job of the handler's types, including
//     jobs its handlers enqueue and dependents their completion releases,
//     until none is left.
//
// The functions take a TB, which *testing.T and *testing.B satisfy, and
// fail it (Errorf then FailNow) when their assertion or their work fails.
package backlogtest

// TB is the part of testing.TB that backlogtest uses. *testing.T,
// *testing.B and *testing.F satisfy it.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
	Cleanup(func())
}

// fatalf fails t with a message prefixed "backlogtest: ".
func fatalf(t TB, format string, args ...any) {
	t.Helper()
	t.Errorf("backlogtest: "+format, args...)
	t.FailNow()
}
