package store

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// postingKeys are the JSON keys of a posting (the root package's posting
// type).
const postingKeys = `type|tags|sched|src|pause|in|cancel|done`

// handBuilt matches a posting's payload built by hand: a JSON builder whose
// first key is a posting's, or JSON text that starts with one.
var handBuilt = regexp.MustCompile(`(?i)(json_build_object|jsonb_build_object|json_object|jsonb_object)\s*\(\s*'(` +
	postingKeys + `)'|'\{\s*"(` + postingKeys + `)"`)

// goPayloads matches the parameter array of payloads Go encoded, which a
// statement sends as they are (pg_notify(…, p) FROM unnest($n::text[]) AS p).
var goPayloads = regexp.MustCompile(`unnest\(\$\d+::text\[\]\) AS p\b`)

// notifyPayloads returns the payload argument (the second) of every
// pg_notify call in sql.
func notifyPayloads(t *testing.T, sql string) []string {
	t.Helper()
	var out []string
	for rest := sql; ; {
		i := strings.Index(rest, "pg_notify(")
		if i < 0 {
			return out
		}
		rest = rest[i+len("pg_notify("):]
		// The arguments, up to the closing parenthesis (quoted text and
		// nested calls skipped).
		var args []string
		depth, quoted, start, end := 0, false, 0, -1
		for k := 0; k < len(rest) && end < 0; k++ {
			switch c := rest[k]; {
			case c == '\'':
				quoted = !quoted
			case quoted:
			case c == '(':
				depth++
			case c == ')' && depth > 0:
				depth--
			case c == ')':
				args, end = append(args, rest[start:k]), k
			case c == ',' && depth == 0:
				args, start = append(args, rest[start:k]), k+1
			}
		}
		require.Len(t, args, 2, "pg_notify call in:\n%s", sql)
		out = append(out, strings.TrimSpace(args[1]))
		rest = rest[end:]
	}
}

// TestPostingsBuiltByPostingFunction: every payload a statement of the
// store sends is either one Go encoded (a parameter) or built by the
// schema's posting(), never by hand; and so is every payload a function of
// a schema migrated to the newest version sends (posting() itself aside).
func TestPostingsBuiltByPostingFunction(t *testing.T) {
	const schema = "posting_check"
	call := pgx.Identifier{schema, "posting"}.Sanitize() + "("
	stmts := statements(New(nil, schema))
	calls, kinds := 0, map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(stmts)) {
		sql := stmts[name]
		if m := handBuilt.FindString(sql); m != "" {
			t.Errorf("statement %s builds a posting by hand: %s", name, m)
		}
		for _, p := range notifyPayloads(t, sql) {
			switch {
			case p == "p":
				require.Regexp(t, goPayloads, sql, "statement %s: payloads p that are not Go's", name)
			case strings.HasPrefix(p, call):
				calls++
				for _, k := range []string{"p_type", "p_tags", "p_sched", "p_in_ms", "p_cancel", "p_done"} {
					if strings.Contains(p, k+" =>") {
						kinds[k] = true
					}
				}
			default:
				t.Errorf("statement %s sends a payload that posting() did not build: %s", name, p)
			}
		}
	}
	// Completion notices (finish, sweep, cancels, failed dependents), the
	// cancel request, and the insert's scheduled posting (3 inserts).
	require.GreaterOrEqual(t, calls, 12)
	require.Equal(t, map[string]bool{"p_sched": true, "p_in_ms": true, "p_cancel": true, "p_done": true}, kinds)

	// The functions of a migrated schema.
	ctx := context.Background()
	_, pool, migrated := newTestStore(t)
	rows, err := pool.Query(ctx, `SELECT p.proname, p.oid::regprocedure::text, p.prosrc FROM pg_proc p WHERE p.pronamespace = $1::regnamespace`, migrated)
	require.NoError(t, err)
	type fn struct{ name, sig, src string }
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.sig, &f.src)
	})
	require.NoError(t, err)
	var sending []string
	for _, f := range fns {
		if f.name == "posting" {
			require.Contains(t, f.src, `"done"`)
			continue
		}
		if m := handBuilt.FindString(f.src); m != "" {
			t.Errorf("function %s builds a posting by hand: %s", f.sig, m)
		}
		ps := notifyPayloads(t, f.src)
		for _, p := range ps {
			// posting()'s, or a variable holding posting()'s (enqueue's
			// p, from v_posts).
			if !strings.HasPrefix(p, "posting(") {
				require.Regexp(t, `^[a-z_]+$`, p, "function %s sends a payload posting() did not build", f.sig)
				require.Contains(t, f.src, "posting(", "function %s", f.sig)
			}
		}
		if len(ps) > 0 {
			sending = append(sending, f.name)
		}
	}
	slices.Sort(sending)
	require.Equal(t, []string{"enqueue", "finish"}, sending, "the functions that send postings")
}

// TestPostingCallsAreInlined: PostgreSQL inlines posting() into the
// statements that call it (the finish path pays for the expression, not
// for a function call), and the arguments left out fold away.
func TestPostingCallsAreInlined(t *testing.T) {
	ctx := context.Background()
	s, pool, _ := newTestStore(t)
	rows, err := pool.Query(ctx, `EXPLAIN (VERBOSE) `+s.fin.failExpired, [16]byte{1}, "expired", s.Channel())
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, `pg_notify(`, plan)
	require.Contains(t, plan, `',"done":"'::text`, plan)
	require.NotContains(t, plan, "posting(", "posting() was not inlined:\n%s", plan)
	require.NotContains(t, plan, "jsonb_path_exists", "the tags' arm did not fold away:\n%s", plan)
}
