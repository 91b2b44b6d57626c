package backlog_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// startLog records each handler start with how many handlers (of all, and
// of its key) ran at that moment, itself included.
type startLog struct {
	mu      sync.Mutex
	running int
	keys    map[string]int
	starts  []startRec
}

type startRec struct {
	at            time.Time
	running, keyN int
}

func (l *startLog) enter(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running++
	l.keys[key]++
	l.starts = append(l.starts, startRec{at: time.Now(), running: l.running, keyN: l.keys[key]})
}

func (l *startLog) leave(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	l.keys[key]--
}

// since returns the starts at or after t.
func (l *startLog) since(t time.Time) []startRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []startRec
	for _, s := range l.starts {
		if !s.at.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// TestLoweredLimitBindsPrefetchedJobs: a type is worked at the default
// prefetch, with quick handlers, until the worker process holds many jobs
// claimed ahead; then its handlers turn slow and a limit is set (or the
// type paused). From the moment SetLimit (Pause) returns in the calling
// process, and within the documented bound in another one (its NOTIFY, or
// the flow watch of a second in poll-only mode), no job starts beyond the
// new limit: the prefetched jobs went back. Before, the worker went on
// starting its buffered jobs at Concurrency (20 at once, 100 a second).
func TestLoweredLimitBindsPrefetchedJobs(t *testing.T) {
	t.Parallel()
	const keys = 5
	cases := []struct {
		name    string
		mode    string // "same": the worker's own Queue sets it; "notify": another Queue; "poll": another Queue, worker in poll-only mode
		limit   backlog.Limit
		pause   bool
		grace   time.Duration // after SetLimit returned: handed-out jobs whose handlers began before it reach enter; the other process hears of it
		check   func(t *testing.T, starts []startRec)
		keyJobs bool
	}{
		{name: "concurrency/same", mode: "same", limit: backlog.Limit{Concurrency: 2}, grace: 100 * time.Millisecond},
		{name: "concurrency/notify", mode: "notify", limit: backlog.Limit{Concurrency: 2}, grace: 500 * time.Millisecond},
		{name: "concurrency/poll", mode: "poll", limit: backlog.Limit{Concurrency: 2}, grace: 2500 * time.Millisecond},
		{name: "key/same", mode: "same", limit: backlog.Limit{KeyConcurrency: 1}, keyJobs: true, grace: 100 * time.Millisecond},
		{name: "rate/same", mode: "same", limit: backlog.Limit{Rate: 4, Per: time.Second}, grace: 100 * time.Millisecond},
		{name: "pause/poll", mode: "poll", pause: true, grace: 2500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, backlog.WithPollInterval(time.Hour))
			ctx := context.Background()
			specs := make([]backlog.JobSpec, 20000)
			for i := range specs {
				specs[i] = backlog.JobSpec{Type: "pf", Args: map[string]int{"i": i}}
				if c.keyJobs {
					k := fmt.Sprintf("k%d", i%keys)
					specs[i].Args = map[string]string{"key": k}
					specs[i].Options = []backlog.EnqueueOption{backlog.ConcurrencyKey(k)}
				}
			}
			for i := 0; i < len(specs); i += 10000 {
				_, err := e.q.EnqueueMany(ctx, specs[i:i+10000])
				require.NoError(t, err)
			}

			worker := e.q
			switch c.mode {
			case "notify":
				worker = e.queue(testdb.NewPool(t, 8), backlog.WithPollInterval(time.Hour))
			case "poll":
				worker = e.queue(testdb.NewPool(t, 8), backlog.WithPollOnly(), backlog.WithPollInterval(time.Hour))
			}
			log := &startLog{keys: map[string]int{}}
			var slow atomic.Bool
			work(t, worker, backlog.HandleJSON(func(ctx context.Context, j *backlog.Job, a struct{ Key string }) error {
				log.enter(a.Key)
				defer log.leave(a.Key)
				if slow.Load() {
					select { // the job's work
					case <-time.After(200 * time.Millisecond):
					case <-ctx.Done():
					}
				}
				return nil
			}), backlog.Concurrency(20), backlog.Types("pf"))

			// Quick handlers: the worker claims far ahead of them.
			deadline := time.Now().Add(30 * time.Second)
			for e.countLive("state = 'running'") < 100 {
				require.True(t, time.Now().Before(deadline), "the worker never held 100 jobs claimed ahead")
				<-time.After(2 * time.Millisecond)
			}
			slow.Store(true)
			if c.pause {
				require.NoError(t, e.q.Pause(ctx, "pf"))
			} else {
				require.NoError(t, e.q.SetLimit(ctx, "pf", c.limit))
			}
			from := time.Now().Add(c.grace)
			var dbFrom time.Time // the same moment on the database's clock, which charges rates
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT clock_timestamp() + $1 * interval '1 millisecond'`,
				c.grace.Milliseconds()).Scan(&dbFrom))
			<-time.After(c.grace + 2*time.Second) // the window observed
			starts := log.since(from)
			violations := 0
			for _, s := range starts {
				switch {
				case c.pause:
					violations++
				case c.limit.Concurrency > 0 && s.running > c.limit.Concurrency,
					c.limit.KeyConcurrency > 0 && s.keyN > c.limit.KeyConcurrency:
					violations++
				}
			}
			if c.limit.Rate > 0 {
				// No window of one period sees more than Rate + Burst - 1
				// starts (Burst defaults to 1 at 4 a second), counted on
				// the database's clock: the claims' start times.
				violations += rateExcess(t, e, "pf", dbFrom, c.limit.Per, c.limit.Rate)
			}
			t.Logf("%d starts in the 2 s observed, %d beyond the new limit", len(starts), violations)
			require.Zero(t, violations, "jobs started beyond the limit after it was set")
			if c.pause {
				require.NoError(t, e.q.Resume(ctx, "pf"))
			}
		})
	}
}

// rateExcess counts the starts (claims, on the database's clock) of typ
// since from that begin a window of per holding more than most.
func rateExcess(t *testing.T, e *env, typ string, from time.Time, per time.Duration, most int) int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT started_at FROM "`+e.schema+`".all_jobs
WHERE type = $1 AND started_at >= $2 ORDER BY started_at`, typ, from)
	require.NoError(t, err)
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	require.NoError(t, err)
	excess := 0
	for i := range starts {
		n := 0
		for _, s := range starts[i:] {
			if s.Sub(starts[i]) < per {
				n++
			}
		}
		if n > most {
			excess++
		}
	}
	return excess
}
