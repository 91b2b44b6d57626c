// Command apirecord writes the records of the exported API, api/backlog.txt
// and api/otelbacklog.txt (`make api` runs it from the repository root). It
// refuses to record an API change while CHANGELOG.md's Unreleased section
// is unchanged since the record was last written; see package apicheck.
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/backlogq/backlog/internal/apicheck"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	wrote, err := apicheck.Update(root, apicheck.Modules)
	if err != nil {
		fmt.Fprintln(os.Stderr, "make api:", err)
		os.Exit(1)
	}
	for _, m := range apicheck.Modules {
		if slices.Contains(wrote, m.Record) {
			fmt.Println("make api: wrote", m.Record)
		} else {
			fmt.Println("make api:", m.Record, "is current")
		}
	}
}
