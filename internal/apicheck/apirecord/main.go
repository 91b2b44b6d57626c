// Command apirecord writes api/backlog.txt, the record of the exported API
// (`make api` runs it from the repository root). It refuses to record an
// API change while CHANGELOG.md's Unreleased section is unchanged since the
// record was last written; see package apicheck.
package main

import (
	"fmt"
	"os"

	"github.com/backlogq/backlog/internal/apicheck"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	wrote, err := apicheck.Update(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "make api:", err)
		os.Exit(1)
	}
	if wrote {
		fmt.Println("make api: wrote", apicheck.RecordPath)
	} else {
		fmt.Println("make api:", apicheck.RecordPath, "is current")
	}
}
