// Package seed fills a queue with jobs in every state, for the dashboard's
// tests, screenshots and measurements.
package seed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/backlogq/backlog"
)

// Job types the seed uses. Work(Handler(…), backlog.Types(Worked...)) runs
// the ones that must finish or run; the others stay where they are put.
const (
	TypeOK       = "thumbnail.render" // completes
	TypeFail     = "invoice.charge"   // fails permanently, completes once retried
	TypeSlow     = "video.transcode"  // runs until released
	TypePausable = "report.build"     // completes; the scenario pauses it
	TypeEmail    = "email.send"       // never worked: stays available
	TypeETL      = "etl"              // the DAG (never worked)
	TypeSync     = "crm.sync"         // the ordering chain (never worked)
	TypeLater    = "digest.weekly"    // scheduled
	TypePaused   = "newsletter.send"  // paused
	ChainKey     = "customer-42"
	Schedule     = "hourly-digest"
)

// XSS payloads, carried by one failing job's type, args, tags and error,
// and by a schedule's name and job type.
const (
	XSSType         = `<script>alert("type")</script>`
	XSSArg          = `"><img src=x onerror=alert(1)>`
	XSSTag          = `<script>alert(2)</script>`
	XSSError        = `<img src=x onerror=alert(3)>`
	XSSSchedule     = `<img src=x onerror=alert(4)>`
	XSSScheduleType = `"><script>alert(5)</script>`
)

// xssCron plans the XSS schedule on 29 February only, so that it never
// enqueues a job during a test (its job type is not worked).
const xssCron = "0 0 29 2 *"

// Worked are the types the seed's Work call handles.
var Worked = []string{TypeOK, TypeFail, TypeSlow, TypePausable, XSSType}

// WorkerTags are the tags the seed's Work call needs to take its jobs.
var WorkerTags = backlog.WorkerTags{"tenant": "acme", "region": "eu", "x": XSSTag}

// Jobs are the seeded jobs' IDs.
type Jobs struct {
	Completed, Failed, Running, XSS   []uuid.UUID
	Available, Cancelled, Scheduled   []uuid.UUID
	DAGRoot, DAGMid, DAGLeaf, DAGSide uuid.UUID
	Chain                             []uuid.UUID
	Paused                            uuid.UUID
}

// Handler works the seeded types: TypeOK and TypePausable complete
// (reporting progress), TypeFail fails permanently on its first attempt
// and completes when retried, XSSType fails permanently, TypeSlow reports
// progress and runs until its context ends or release is closed.
func Handler(release <-chan struct{}) backlog.Handler {
	return backlog.HandlerFunc(func(ctx context.Context, job *backlog.Job) error {
		switch job.Type {
		case TypeOK, TypePausable:
			if err := job.SetProgress(ctx, map[string]int{"tiles": 16, "of": 16}); err != nil {
				return err
			}
			return job.SetResult(map[string]any{"pixels": 1024, "ok": true})
		case TypeFail:
			if job.Attempt > 1 {
				return nil // a retry succeeds
			}
			return backlog.Permanent(errors.New("card declined: insufficient funds\n\tat billing.Charge (billing.go:42)\n\tat main.handler (main.go:17)"))
		case XSSType:
			return backlog.Permanent(errors.New(XSSError))
		case TypeSlow:
			if err := job.SetProgress(ctx, map[string]int{"frames": 1200, "of": 4800}); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-release:
				return nil
			}
		}
		return fmt.Errorf("seed: unexpected type %q", job.Type)
	})
}

// Enqueue enqueues the seed's jobs (n of the plain kinds) and pauses
// TypePaused. The worked jobs reach their states once a Work call with
// Handler runs.
func Enqueue(ctx context.Context, q *backlog.Queue, n int) (*Jobs, error) {
	j := &Jobs{}
	var err error
	add := func(dst *[]uuid.UUID, typ string, args any, opts ...backlog.EnqueueOption) {
		if err != nil {
			return
		}
		var id uuid.UUID
		id, err = q.Enqueue(ctx, typ, args, opts...)
		*dst = append(*dst, id)
	}
	for i := range n {
		add(&j.Completed, TypeOK, map[string]any{"image": fmt.Sprintf("photos/%d.jpg", i), "size": []int{640, 480}},
			backlog.Tags{"tenant": "acme"})
		add(&j.Failed, TypeFail, map[string]any{"invoice": 1000 + i, "amount_cents": 4999}, backlog.Tags{"region": "eu"},
			backlog.MaxAttempts(1))
		add(&j.Available, TypeEmail, map[string]any{"to": fmt.Sprintf("user%d@example.com", i), "template": "welcome"},
			backlog.Tags{"tenant": "acme"})
		add(&j.Scheduled, TypeLater, map[string]any{"week": 48}, backlog.Delay(time.Hour))
	}
	add(&j.Completed, TypePausable, map[string]any{"report": "monthly"})
	add(&j.Running, TypeSlow, map[string]any{"video": "launch.mp4"})
	add(&j.XSS, XSSType, map[string]any{"html": XSSArg}, backlog.Tags{"x": XSSTag}, backlog.MaxAttempts(1))
	var c []uuid.UUID
	add(&c, TypeEmail, map[string]any{"to": "gone@example.com"})
	if err != nil {
		return nil, err
	}
	if _, err := q.Cancel(ctx, c[0]); err != nil {
		return nil, err
	}
	j.Cancelled = c
	// A DAG: extract → transform → load, extract → notify.
	var ids []uuid.UUID
	add(&ids, TypeETL+".extract", map[string]any{"table": "orders"}, backlog.Delay(time.Hour))
	if err != nil {
		return nil, err
	}
	j.DAGRoot = ids[0]
	add(&ids, TypeETL+".transform", map[string]any{"step": "dedupe"}, backlog.DependsOn(j.DAGRoot))
	if err != nil {
		return nil, err
	}
	j.DAGMid = ids[1]
	add(&ids, TypeETL+".load", map[string]any{"into": "warehouse"}, backlog.DependsOn(j.DAGMid))
	add(&ids, TypeETL+".notify", map[string]any{"channel": "#data"}, backlog.DependsOn(j.DAGRoot))
	if err != nil {
		return nil, err
	}
	j.DAGLeaf, j.DAGSide = ids[2], ids[3]
	// An ordering chain of three.
	for i := range 3 {
		add(&j.Chain, TypeSync, map[string]any{"customer": 42, "change": i}, backlog.OrderingKey(ChainKey),
			backlog.Delay(time.Hour))
	}
	if err := q.Pause(ctx, TypePaused); err != nil {
		return nil, err
	}
	var p []uuid.UUID
	add(&p, TypePaused, map[string]any{"issue": 7})
	if err != nil {
		return nil, err
	}
	j.Paused = p[0]
	if err := q.Cron(XSSSchedule, xssCron, XSSScheduleType, map[string]any{"html": XSSArg}); err != nil {
		return nil, err
	}
	return j, q.Every(Schedule, time.Hour, TypeLater, map[string]any{"digest": "hourly"})
}
