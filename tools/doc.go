// Package tools pins the development tools of backlog (staticcheck) in a
// module of their own, so the library's go.mod never lists them.
// scripts/lint.sh runs them with `go tool` from this directory: built once,
// then taken from Go's build cache.
package tools
