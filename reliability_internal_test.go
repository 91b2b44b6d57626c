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
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/store"
	"github.com/backlogq/backlog/internal/testdb"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A job this process re-claims after a stall longer than its lease gets a
// new lease; the handler of the old one is stopped, never left running
// unfenced beside the new attempt.
func TestReclaimStopsTheOldLeasesHandler(t *testing.T) {
	ls := newLeases(nil, quiet(), nil, time.Minute, nil)
	id := uuid.New()
	first := ls.Add([]*store.Claimed{{ID: id, Token: uuid.New(), Type: "t"}}, time.Now())[0]
	ctx, cancel := context.WithCancelCause(context.Background())
	require.NoError(t, ls.begin(first, cancel))

	second := ls.Add([]*store.Claimed{{ID: id, Token: uuid.New(), Type: "t"}}, time.Now())[0]
	require.ErrorIs(t, context.Cause(ctx), ErrLeaseLost)
	require.True(t, ls.end(first, nil).lost)
	require.False(t, ls.end(second, nil).lost)
	// The old attempt's settlement leaves the new lease registered.
	ls.remove(first)
	require.Same(t, second, ls.held[id])
}

// A posting is bounded by construction: tags that would not fit are left
// out, and the posting still wakes every domain of its type.
func TestPostingsAreBounded(t *testing.T) {
	tags := map[string]string{}
	for i := range 40 {
		tags[strings.Repeat(string(rune('a'+i%26)), 150)+string(rune('A'+i))] = strings.Repeat("v", 200)
	}
	p := posting.Encode(posting.Posting{Type: strings.Repeat("t", maxTypeBytes), Tags: tags, In: 5})
	require.LessOrEqual(t, len(p), posting.MaxBytes)
	var back posting.Posting
	require.NoError(t, json.Unmarshal([]byte(p), &back))
	require.Nil(t, back.Tags)
	d, err := newDomainSpec([]string{back.Type}, map[string]string{"region": "eu"})
	require.NoError(t, err)
	require.True(t, d.matches(back.Type, back.Tags))
	raw, err := json.Marshal(tags)
	require.NoError(t, err)
	require.Nil(t, posting.DecodeTags(raw), "oversized tags from the database are not posted")
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
