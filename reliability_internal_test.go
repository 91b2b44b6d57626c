package backlog

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A job this process re-claims after a stall longer than its lease gets a
// new lease; the handler of the old one is stopped, never left running
// unfenced beside the new attempt.
func TestReclaimStopsTheOldLeasesHandler(t *testing.T) {
	ls := newLeases(nil, quiet(), nil, time.Minute)
	id := uuid.New()
	first := ls.add([]uuid.UUID{id}, []uuid.UUID{uuid.New()}, []string{"t"}, time.Now())[0]
	ctx, cancel := context.WithCancelCause(context.Background())
	require.NoError(t, ls.begin(first, cancel))

	second := ls.add([]uuid.UUID{id}, []uuid.UUID{uuid.New()}, []string{"t"}, time.Now())[0]
	require.ErrorIs(t, context.Cause(ctx), ErrLeaseLost)
	_, lost := ls.end(first)
	require.True(t, lost)
	_, lost = ls.end(second)
	require.False(t, lost)
	// The old attempt's settlement leaves the new lease registered.
	ls.remove(first)
	require.Same(t, second, ls.held[id])
}

// Every plans at multiples of the interval since the Unix epoch, as the
// documentation says: weekly plans fall on Thursdays 00:00 UTC (1970-01-01
// was a Thursday), not on Mondays (Go's zero time).
func TestEveryPlansAlignToTheUnixEpoch(t *testing.T) {
	p := everyPlanner(7 * 24 * time.Hour)
	n := p.next(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)) // a Monday
	require.Equal(t, time.Thursday, n.Weekday())
	require.Equal(t, time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), n.UTC())
	require.Equal(t, time.Unix(90, 0), everyPlanner(90*time.Second).next(time.Unix(0, 1)))
	require.Equal(t, time.Unix(0, 0), everyPlanner(90*time.Second).next(time.Unix(-1, 0)))
}

// After long downtime only the most recent plans are computed, whatever
// the schedule and however long ago the last plan was.
func TestMissedPlansAfterLongDowntime(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC)
	last := now.Add(-30 * 365 * 24 * time.Hour)
	s, err := cron.ParseStandard("* * * * *")
	require.NoError(t, err)
	start := time.Now()
	got := missedPlans(cronPlanner{s}, last, now, 3)
	require.Less(t, time.Since(start), time.Second)
	require.Equal(t, []time.Time{now.Truncate(time.Minute).Add(-2 * time.Minute), now.Truncate(time.Minute).Add(-time.Minute), now.Truncate(time.Minute)}, got)

	got = missedPlans(everyPlanner(time.Second), now.Add(-12*24*time.Hour), now, 1)
	require.Equal(t, []time.Time{now}, got, "@every 1s after 12 days down: the latest plan")
	require.Empty(t, missedPlans(cronPlanner{s}, now.Add(-time.Second), now, 1))
}

// A posting is bounded by construction: tags that would not fit are left
// out, and the posting still wakes every domain of its type.
func TestPostingsAreBounded(t *testing.T) {
	tags := map[string]string{}
	for i := range 40 {
		tags[strings.Repeat(string(rune('a'+i%26)), 150)+string(rune('A'+i))] = strings.Repeat("v", 200)
	}
	p := encodePosting(posting{Type: strings.Repeat("t", MaxTypeBytes), Tags: tags, In: 5})
	require.LessOrEqual(t, len(p), maxPostingBytes)
	var back posting
	require.NoError(t, json.Unmarshal([]byte(p), &back))
	require.Nil(t, back.Tags)
	d, err := newDomainSpec([]string{back.Type}, map[string]string{"region": "eu"})
	require.NoError(t, err)
	require.True(t, d.matches(back.Type, back.Tags))
	raw, err := json.Marshal(tags)
	require.NoError(t, err)
	require.Nil(t, decodeTags(raw), "oversized tags from the database are not posted")
}

// The notifier sends a batch in one statement; a payload the server
// refuses is dropped alone and the others are delivered.
func TestNotifierDropsOnlyARefusedPayload(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	st := store.New(pool, schema)
	conn, err := pgx.Connect(ctx, testdb.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{st.Channel()}.Sanitize())
	require.NoError(t, err)
	n := newNotifier(0, quiet(), nil, st)
	defer n.close()
	n.send(ctx, []string{`{"type":"a"}`, strings.Repeat("x", 9000), `{"type":"b"}`})
	var got []string
	for len(got) < 2 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := conn.WaitForNotification(wctx)
		cancel()
		require.NoError(t, err)
		got = append(got, msg.Payload)
	}
	require.ElementsMatch(t, []string{`{"type":"a"}`, `{"type":"b"}`}, got)
}

// The completer's back-pressure: claims wait while it holds its limit of
// outcomes, and go on as soon as one is settled.
func TestCompleterBackPressure(t *testing.T) {
	c := newCompleter(nil, newLeases(nil, quiet(), nil, time.Minute), quiet(), nil, nil)
	c.held = maxHeldOutcomes
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.admit(ctx), context.DeadlineExceeded)
	done := make(chan error, 1)
	go func() { done <- c.admit(context.Background()) }()
	c.settle(&finishReq{}, true)
	require.NoError(t, <-done)
	require.NoError(t, c.admit(context.Background()))
}
