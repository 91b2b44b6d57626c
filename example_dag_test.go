package backlog_test

import (
	"context"
	"fmt"

	"github.com/backlogq/backlog"
)

// Each step of a DAG reads the typed results of the jobs it depends on.
func ExamplePrerequisiteResult() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	type Page struct{ Words []string }
	type Count struct{ N int }

	fetch, count, report := backlog.NewID(), backlog.NewID(), backlog.NewID()
	_, err := q.EnqueueMany(ctx, []backlog.JobSpec{
		{ID: fetch, Type: "fetch"},
		{ID: count, Type: "count", Options: []backlog.EnqueueOption{backlog.DependsOn(fetch)}},
		{ID: report, Type: "report", Options: []backlog.EnqueueOption{backlog.DependsOn(fetch, count)}},
	})
	if err != nil {
		panic(err)
	}
	mux := backlog.NewMux()
	mux.HandleFunc("fetch", func(ctx context.Context, job *backlog.Job) error {
		return job.SetResult(Page{Words: []string{"to", "be", "or", "not"}})
	})
	mux.HandleFunc("count", func(ctx context.Context, job *backlog.Job) error {
		page, err := backlog.PrerequisiteResult[Page](ctx, job, job.PrerequisiteIDs()[0])
		if err != nil {
			return err
		}
		return job.SetResult(Count{N: len(page.Words)})
	})
	mux.HandleFunc("report", func(ctx context.Context, job *backlog.Job) error {
		// The first call reads every prerequisite's result in one statement.
		page, err := backlog.PrerequisiteResultOfType[Page](ctx, job, "fetch")
		if err != nil {
			return err
		}
		n, err := backlog.PrerequisiteResultOfType[Count](ctx, job, "count")
		if err != nil {
			return err
		}
		fmt.Printf("%d words, starting with %q\n", n.N, page.Words[0])
		return nil
	})
	stop := workInBackground(q, mux)
	defer stop()
	if _, err := q.Wait(ctx, report); err != nil {
		panic(err)
	}
	// Output:
	// 4 words, starting with "to"
}

// A handler reports how far it has got; Queue.Job shows it, also once the
// job has ended.
func ExampleJob_SetProgress() {
	q, _, cleanup := exampleQueue()
	defer cleanup()
	ctx := context.Background()

	id, err := q.Enqueue(ctx, "import", nil)
	if err != nil {
		panic(err)
	}
	stop := workInBackground(q, backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		const rows = 10_000
		for i := range rows {
			// Cheap: the lease renewal writes the latest value about once a
			// second, and the finish writes the last one.
			if err := job.SetProgress(ctx, map[string]int{"done": i + 1, "of": rows}); err != nil {
				return err
			}
		}
		return nil
	}), backlog.Types("import"))
	defer stop()
	info, err := q.Wait(ctx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.State, string(info.Progress))
	// Output:
	// completed {"of": 10000, "done": 10000}
}
