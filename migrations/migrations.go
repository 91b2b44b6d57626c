// Package migrations holds backlog's versioned SQL migrations.
//
// Files follow golang-migrate's naming (NNNN_name.up.sql / .down.sql) and use
// unqualified table names: Queue.Migrate runs each with search_path set to
// the queue's schema (functions capture it with SET search_path FROM
// CURRENT). Teams that run their own migration tool take the files from
// `backlog migrate sql --format golang-migrate|goose`, which wraps each
// one so that it targets the schema, records backlog's version and skips
// what the schema already has (see internal/migrate.Export); running these
// files as they are under another tool records nothing in backlog's
// version table.
//
// # Versions
//
// Versions only ever grow, and are not contiguous: there is no 0007. No
// commit in the history (git log --all -- migrations/) ever had a 0007
// file, and no commit message says why; what the history shows is that
// migration 0008 (processes and schedules, commit ed3cefe) was written on a
// branch that started beside the operator API's work (List, Retry, Pause,
// the per-minute counters: commit 3b59bf4), which changed the schema too.
// The processes branch took 8, leaving 7 for that work, which put its
// tables and indexes into 0006 instead (0006 had not been released), so 7
// was never used. The gap is harmless: backlog, golang-migrate and
// goose order versions and do not require them to be consecutive
// (reverting 0008 goes back to 0006). It must never be filled: a schema
// at version 8 or later would never apply a new 0007, since a migration
// runs only when its version is above the schema's.
//
// Two branches that each add a migration take the next free number each;
// the one merged second renumbers its files (as flow control and SQL
// enqueue did, 0009 and 0010), so the numbers follow the order of merging.
// Code and tests must not assume the newest version or a count: they read
// the list (internal/migrate.Load).
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
