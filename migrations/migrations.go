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
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
