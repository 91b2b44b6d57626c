package backlog_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/migrate"
	"github.com/backlogq/backlog/migrations"
)

// firstRuledMigration is the first migration the rule of
// TestEveryMigrationHasItsTests applies to in full: every migration from it
// on comes with its two tests (docs/compatibility.md).
const firstRuledMigration = 22

// rollingUpgradeBeforeTheRule says, for each migration older than the
// rule, which test holds the previous version's processes working against
// it, or why none does. The test names must exist.
var rollingUpgradeBeforeTheRule = map[int64]string{
	1:  "none: the first schema",
	2:  "none (before the rule)",
	3:  "none (before the rule)",
	4:  "none (before the rule)",
	5:  "none (before the rule)",
	6:  "TestScheduledJobsStayOutOfTheClaimPath (internal/store: an older process's insert of a job due later)",
	8:  "none (before the rule)",
	9:  "none (before the rule)",
	10: "none (before the rule)",
	11: "TestMetadataOldClaims (processes of versions 9 and 10 keep claiming through claim())",
	12: "none: 0011 and 0012 ship together; a process built with 0011 alone must not run against 0012 (docs/dags.md)",
	13: "none (before the rule; no signature changed)",
	14: "none (before the rule; docs/operations.md says what processes of version 13 do)",
	15: "none (before the rule)",
	16: "none (before the rule; indexes only)",
	17: "none (before the rule)",
	18: "TestRetryDependentEnqueuedByAnEarlierVersion (a dependent enqueued before 0018)",
	19: "TestPostingSQLMatchesGo (SQL payloads equal to the Go encoder's, which earlier processes parse)",
	20: "none (before the rule)",
	21: "TestMigration21RollingUpgrade",
}

// testFuncs returns the names of the Test functions of the _test.go files
// in dirs.
func testFuncs(t *testing.T, dirs ...string) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		require.NoError(t, err)
		for _, f := range files {
			af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, d := range af.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
					names[fd.Name.Name] = true
				}
			}
		}
	}
	return names
}

// TestEveryMigrationHasItsTests is the rule of docs/compatibility.md: a
// migration NN (from firstRuledMigration on) ships with
// TestMigrationNNRollingUpgrade, which shows processes of the previous
// version working against the migrated schema, and
// TestMigrationNNDownRestoresVersionMM (MM: the previous migration), which
// shows its down migration restoring the previous schema. Adding a
// migration file without them fails here, naming the tests to write.
func TestEveryMigrationHasItsTests(t *testing.T) {
	t.Parallel()
	ms, err := migrate.Load(migrations.FS)
	require.NoError(t, err)
	names := testFuncs(t, ".", filepath.Join("internal", "store"))
	var missing []string
	for i, m := range ms {
		if m.Version < firstRuledMigration {
			why, ok := rollingUpgradeBeforeTheRule[m.Version]
			if !ok {
				missing = append(missing, fmt.Sprintf("migration %04d: not in rollingUpgradeBeforeTheRule (a migration older than the rule cannot be added)", m.Version))
				continue
			}
			if name, _, _ := strings.Cut(why, " "); strings.HasPrefix(name, "Test") && !names[name] {
				missing = append(missing, fmt.Sprintf("migration %04d: rollingUpgradeBeforeTheRule names %s, which does not exist", m.Version, name))
			}
			continue
		}
		prev := ms[i-1].Version
		for _, name := range []string{
			fmt.Sprintf("TestMigration%dRollingUpgrade", m.Version),
			fmt.Sprintf("TestMigration%dDownRestoresVersion%d", m.Version, prev),
		} {
			if !names[name] {
				missing = append(missing, fmt.Sprintf("migration %04d (%s): no func %s in the root package's tests "+
					"(see docs/compatibility.md, \"Schema migrations\")", m.Version, m.Name, name))
			}
		}
	}
	for v := range rollingUpgradeBeforeTheRule {
		found := false
		for _, m := range ms {
			found = found || m.Version == v
		}
		if !found {
			missing = append(missing, fmt.Sprintf("rollingUpgradeBeforeTheRule lists migration %04d, which does not exist", v))
		}
	}
	require.Empty(t, missing)
	_, err = os.Stat(filepath.Join("docs", "compatibility.md"))
	require.NoError(t, err, "the rule is stated in docs/compatibility.md")
}

// TestMigration21RollingUpgrade: processes of version 20 keep running
// against a schema at 0021. Migration 0021 changed only finish()'s body
// (same signature); processes of version 20 call it with the states they
// knew, never 'discarded', which is what a process of this version does
// without WithDiscardCompleted. Their completed jobs must still be kept in
// job_history with their results, and counted as completed under that
// state (0021 moved the per-minute counting from the history rows to the
// deleted rows).
func TestMigration21RollingUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t) // no WithDiscardCompleted: finish() as version 20 calls it
	st, err := e.q.MigrationStatus(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.Version, int64(21))

	withResult, err := e.q.Enqueue(ctx, "v20", map[string]bool{"result": true})
	require.NoError(t, err)
	plain, err := e.q.Enqueue(ctx, "v20", map[string]bool{"result": false})
	require.NoError(t, err)
	stop := work(t, e.q, backlog.HandleJSON(func(_ context.Context, job *backlog.Job, a map[string]bool) error {
		if a["result"] {
			return job.SetResult("kept")
		}
		return nil
	}), backlog.Types("v20"))
	e.waitState(withResult, 10*time.Second, backlog.StateCompleted)
	e.waitState(plain, 10*time.Second, backlog.StateCompleted)
	require.NoError(t, stop())

	var inHistory int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.schema+`".job_history WHERE id = ANY($1) AND state = 'completed'`,
		[]uuid.UUID{withResult, plain}).Scan(&inHistory))
	require.Equal(t, 2, inHistory, "both completions kept in job_history")
	info, err := e.q.Job(ctx, withResult)
	require.NoError(t, err)
	require.JSONEq(t, `"kept"`, string(info.Result))

	var completed, discarded int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT coalesce(sum(n) FILTER (WHERE state = 'completed'), 0),
		coalesce(sum(n) FILTER (WHERE state = 'discarded'), 0) FROM "`+e.schema+`".job_counts WHERE type = 'v20'`).Scan(&completed, &discarded))
	require.Equal(t, int64(2), completed)
	require.Zero(t, discarded)
	stats, err := e.q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), stats.ByType["v20"][backlog.StateCompleted])
}
