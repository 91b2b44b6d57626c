module github.com/backlogq/backlog/cmd/backlog

go 1.26.8

// The library in this repository. A release of the CLI (a tag
// cmd/backlog/vX.Y.Z) drops this line and requires the released library:
// `go install …/cmd/backlog@version` refuses modules with replace directives.
replace github.com/backlogq/backlog => ../..

// goose and golang-migrate are for tests only (sql_test.go runs the files
// `backlog migrate sql` exports with them, as libraries); the command does
// not import them.
require (
	github.com/backlogq/backlog v0.0.0-00010101000000-000000000000
	github.com/golang-migrate/migrate/v4 v4.20.1
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/pressly/goose/v3 v3.30.0
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/jackc/pgerrcode v0.0.0-20220416144525-469b46aa5efa // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/sethvargo/go-retry v0.5.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)
