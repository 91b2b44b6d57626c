// Package migrations holds backlog's versioned SQL migrations.
//
// Files follow golang-migrate's naming (NNNN_name.up.sql / .down.sql) and use
// unqualified table names, so they run as-is under any tool that sets
// search_path to the target schema. Queue.Migrate applies them itself.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
