module github.com/backlogq/backlog/backlogtest/internal/pqtest

go 1.26.8

// Tests of the library with lib/pq, in a module of their own so that the
// library's go.mod never lists lib/pq.
replace github.com/backlogq/backlog => ../../..

require (
	github.com/backlogq/backlog v0.0.0-00010101000000-000000000000
	github.com/lib/pq v1.12.3
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
