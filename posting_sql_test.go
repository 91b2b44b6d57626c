package backlog

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/internal/posting"
	"github.com/backlogq/backlog/internal/testdb"
	"github.com/backlogq/backlog/migrations"
)

// postingSQL is one call of the schema's posting() (migration 0019): its
// arguments, NULL when nil.
type postingSQL struct {
	typ    *string
	tags   *string // JSON, as jsonb
	sched  *bool
	inMS   *int64
	cancel *uuid.UUID
	done   *uuid.UUID
}

// sqlPosting returns what posting() writes for a.
func sqlPosting(t *testing.T, db *pgx.Conn, schema string, a postingSQL) string {
	t.Helper()
	var out string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT `+pgx.Identifier{schema, "posting"}.Sanitize()+
		`(p_type => $1, p_tags => $2::jsonb, p_sched => $3, p_in_ms => $4, p_cancel => $5, p_done => $6)`,
		a.typ, a.tags, a.sched, a.inMS, a.cancel, a.done).Scan(&out))
	return out
}

// dbTags is tags as the jobs table gives them back (jsonb's text), what
// Go's postingOf reads.
func dbTags(t *testing.T, db *pgx.Conn, tags string) []byte {
	t.Helper()
	var out string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT $1::jsonb::text`, tags).Scan(&out))
	return []byte(out)
}

// TestPostingSQLMatchesGo: the schema's posting() (the one definition of
// the payload format in SQL, which enqueue(), finish() and the store's
// statements call) writes, for every kind of posting, a payload that Go's
// decoder reads as the posting Go's encodePosting writes: type only, type
// and tags, tags too large or not posted, scheduled with and without a
// due time, cancel, done. Where no tags and no string Go escapes
// differently are involved, the bytes are Go's too.
func TestPostingSQLMatchesGo(t *testing.T) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, testdb.Pool(t), schema, ms)
	require.NoError(t, err)
	db, err := pgx.Connect(ctx, testdb.URL())
	require.NoError(t, err)
	defer db.Close(ctx)

	ptr := func(s string) *string { return &s }
	yes, in, zero := true, int64(1500), int64(0)
	id := uuid.Must(uuid.NewV7())
	bigType := strings.Repeat("t", MaxTypeBytes)
	big := map[string]string{} // over 7,000 bytes: never posted
	for i := range 40 {
		big[strings.Repeat(string(rune('a'+i%26)), 150)+string(rune('A'+i))] = strings.Repeat("v", 200)
	}
	bigJSON, err := json.Marshal(big)
	require.NoError(t, err)
	valid := map[string]string{} // near the validation limits: always posted
	for i := range MaxTags {
		valid[strings.Repeat(string(rune('a'+i%26)), 19)+string(rune('A'+i))] = strings.Repeat("<", 16)
	}
	validJSON, err := json.Marshal(valid)
	require.NoError(t, err)
	require.NoError(t, validateTags("tags", valid))
	require.Greater(t, len(validJSON), MaxTagsBytes*9/10)
	odd := "a<b>&\"\\\n\t\b\f\x01\u2028\u2029é" // escaped differently by Go and PostgreSQL
	oddTags, err := json.Marshal(map[string]string{"k<": odd, "b": "x"})
	require.NoError(t, err)

	cases := []struct {
		name  string
		sql   postingSQL
		tags  string          // the tags Go posts, as the database gives them back ("": none)
		goP   posting.Posting // what Go posts (tags from .tags through posting.Of)
		bytes bool            // the payloads are equal byte for byte
	}{
		{name: "type only", sql: postingSQL{typ: ptr("email.send")}, goP: posting.Posting{Type: "email.send"}, bytes: true},
		{name: "type Go escapes", sql: postingSQL{typ: ptr(odd)}, goP: posting.Posting{Type: odd}},
		{name: "type and tags", sql: postingSQL{typ: ptr("email.send"), tags: ptr(`{"region": "eu", "tier": "gold"}`)},
			tags: `{"region": "eu", "tier": "gold"}`, goP: posting.Posting{Type: "email.send"}},
		{name: "tags Go escapes", sql: postingSQL{typ: ptr("a"), tags: ptr(string(oddTags))}, tags: string(oddTags), goP: posting.Posting{Type: "a"}},
		{name: "tags at the validation limits", sql: postingSQL{typ: ptr(bigType), tags: ptr(string(validJSON))},
			tags: string(validJSON), goP: posting.Posting{Type: bigType}},
		{name: "tags too large", sql: postingSQL{typ: ptr(bigType), tags: ptr(string(bigJSON))},
			tags: string(bigJSON), goP: posting.Posting{Type: bigType}},
		{name: "tags empty", sql: postingSQL{typ: ptr("a"), tags: ptr(`{}`)}, tags: `{}`, goP: posting.Posting{Type: "a"}, bytes: true},
		{name: "tags not strings", sql: postingSQL{typ: ptr("a"), tags: ptr(`{"a": "x", "n": 1}`)},
			tags: `{"a": "x", "n": 1}`, goP: posting.Posting{Type: "a"}, bytes: true},
		{name: "tags null value", sql: postingSQL{typ: ptr("a"), tags: ptr(`{"a": null, "b": "x"}`)},
			tags: `{"a": null, "b": "x"}`, goP: posting.Posting{Type: "a"}},
		{name: "tags not an object", sql: postingSQL{typ: ptr("a"), tags: ptr(`["a"]`)}, tags: `["a"]`, goP: posting.Posting{Type: "a"}, bytes: true},
		{name: "tags JSON null", sql: postingSQL{typ: ptr("a"), tags: ptr(`null`)}, tags: `null`, goP: posting.Posting{Type: "a"}, bytes: true},
		{name: "sched with in", sql: postingSQL{sched: &yes, inMS: &in}, goP: posting.Sched(1500 * 1e6), bytes: true},
		{name: "sched due now", sql: postingSQL{sched: &yes, inMS: &zero}, goP: posting.Sched(0), bytes: true},
		{name: "cancel", sql: postingSQL{cancel: &id}, goP: posting.Posting{Cancel: id.String()}, bytes: true},
		{name: "done", sql: postingSQL{done: &id}, goP: posting.Posting{Done: id.String()}, bytes: true},
		{name: "empty", goP: posting.Posting{}, bytes: true},
		{name: "every field", sql: postingSQL{typ: ptr("a"), tags: ptr(`{"r": "eu"}`), sched: &yes, inMS: &in, cancel: &id, done: &id},
			tags: `{"r": "eu"}`, goP: posting.Posting{Type: "a", Sched: true, In: 1500, Cancel: id.String(), Done: id.String()}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.tags != "" {
				c.goP.Tags = posting.Of(c.goP.Type, dbTags(t, db, c.tags)).Tags
			}
			want := posting.Encode(c.goP)
			got := sqlPosting(t, db, schema, c.sql)
			require.LessOrEqual(t, len(got), posting.MaxBytes)
			var gotP, wantP posting.Posting
			require.NoError(t, json.Unmarshal([]byte(want), &wantP))
			require.NoError(t, json.Unmarshal([]byte(got), &gotP), "posting() wrote %s", got)
			require.Equal(t, wantP, gotP, "Go: %s\nSQL: %s", want, got)
			if c.bytes {
				require.Equal(t, want, got)
			}
		})
	}
	// The cases cover what they say.
	require.Nil(t, posting.Of("a", dbTags(t, db, string(bigJSON))).Tags)
	require.Len(t, posting.Of("a", dbTags(t, db, string(validJSON))).Tags, MaxTags)
}

// TestPostingSQLBound: posting() leaves the tags out exactly when its
// payload would pass posting.MaxBytes. (Its bytes are not Go's where tags
// are involved, so near the bound the two encoders can decide differently:
// only for tags larger than any enqueue accepts, and either way the
// payload fits and wakes the type's domains; see TestPostingSQLMatchesGo
// for tags at the validation limits.)
func TestPostingSQLBound(t *testing.T) {
	ctx := context.Background()
	schema := testdb.Schema(t)
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	_, err = migrate.Up(ctx, testdb.Pool(t), schema, ms)
	require.NoError(t, err)
	db, err := pgx.Connect(ctx, testdb.URL())
	require.NoError(t, err)
	defer db.Close(ctx)

	typ := "a"
	// {"type":"a","tags":{"k": "…"}}: 29 bytes and the value's.
	for _, n := range []int{posting.MaxBytes - 29 - 1, posting.MaxBytes - 29, posting.MaxBytes - 29 + 1} {
		tags := `{"k": "` + strings.Repeat("v", n) + `"}`
		got := sqlPosting(t, db, schema, postingSQL{typ: &typ, tags: &tags})
		var p posting.Posting
		require.NoError(t, json.Unmarshal([]byte(got), &p))
		if n+29 <= posting.MaxBytes {
			require.Equal(t, n+29, len(got))
			require.Equal(t, posting.Posting{Type: "a", Tags: map[string]string{"k": strings.Repeat("v", n)}}, p)
		} else {
			require.Equal(t, `{"type":"a"}`, got)
		}
	}
}
