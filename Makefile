# backlog — the two commands a newcomer needs:
#   make demo   runs examples/quickstart against a real PostgreSQL
#   make test   runs the whole test suite (-race) against a real PostgreSQL
# Both use $DATABASE_URL, else the server on 127.0.0.1:5432 if it answers,
# else a throw-away cluster (scripts/with-db.sh).

GO ?= go
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

.PHONY: test test-short lint demo bench bench-quick

test: lint
	scripts/with-db.sh $(GO) test -race -count=1 -timeout 8m ./...

test-short:
	scripts/with-db.sh $(GO) test -race -count=1 -short ./...

lint:
	scripts/lint.sh

demo:
	scripts/with-db.sh $(GO) run ./examples/quickstart
