package migrate

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// File is one exported migration file.
type File struct {
	Name string
	Text string
}

// Formats Export writes.
const (
	FormatGolangMigrate = ToolGolangMigrate
	FormatGoose         = ToolGoose
)

// schemaRE is what backlog.WithSchema accepts.
var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,47}$`)

// Dollar-quote tags of the exported blocks; a migration must not use them.
const (
	blockTag = "$backlog_migrate$"
	sqlTag   = "$backlog_sql$"
)

// Export renders the migrations as files for another migration tool, on
// schema: for golang-migrate, NNNN_name.up.sql and NNNN_name.down.sql; for
// goose, NNNN_name.sql with its -- +goose Up and Down sections. The
// version in a file's name is backlog's.
//
// Each direction is one statement, a DO block (goose gets it between
// StatementBegin and StatementEnd, golang-migrate sends a file whole), that
//   - takes backlog's migration lock for the schema (Up's), so it
//     serialises with Queue.Migrate and with the other exported files;
//   - creates the schema if it is missing, and sets search_path to it for
//     the migration only (restored at the end: goose writes its own table
//     in the same transaction, unqualified), so the files target the
//     schema they were exported for whatever the tool's connection says,
//     and functions capture (SET search_path FROM CURRENT) exactly what
//     Queue.Migrate makes them capture;
//   - reads backlog's version from schema_migrations and runs the
//     migration only when the schema lacks it, records the new version
//     there and names the tool in the table's comment. An up migration
//     already applied (by backlog or another tool) is skipped, so a schema
//     Queue.Migrate made can be handed to goose or golang-migrate, which
//     then run every file and only record them; an up migration whose
//     predecessor is missing fails rather than run out of order. A down
//     migration reverts only the schema's newest migration (it fails
//     while a newer one is applied, and skips one not applied).
//
// golang-migrate may share schema_migrations (its default table, when the
// connection's search_path is the schema): it writes (N, dirty) before it
// runs file N, which the blocks take for "golang-migrate is running this
// one" and run.
func Export(ms []Migration, schema, format string) ([]File, error) {
	if !schemaRE.MatchString(schema) {
		return nil, fmt.Errorf("schema %q is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 48 bytes)", schema)
	}
	if format != FormatGolangMigrate && format != FormatGoose {
		return nil, fmt.Errorf("format must be %s or %s, got %q", FormatGolangMigrate, FormatGoose, format)
	}
	var out []File
	for i, m := range ms {
		if !m.HasDown {
			return nil, fmt.Errorf("migration %04d_%s has no down migration", m.Version, m.Name)
		}
		for _, text := range []string{m.SQL, m.Down} {
			if strings.Contains(text, blockTag) || strings.Contains(text, sqlTag) {
				return nil, fmt.Errorf("migration %04d_%s uses the dollar quote %s or %s, which its export needs", m.Version, m.Name, blockTag, sqlTag)
			}
			for _, l := range strings.Split(text, "\n") {
				if l = strings.TrimSpace(l); strings.HasPrefix(l, "--") && strings.Contains(l, "+goose") {
					return nil, fmt.Errorf("migration %04d_%s has a comment goose would read as an annotation: %q", m.Version, m.Name, l)
				}
			}
		}
		var prev int64
		if i > 0 {
			prev = ms[i-1].Version
		}
		e := exporter{m: m, prev: prev, schema: schema, tool: format}
		base := fmt.Sprintf("%04d_%s", m.Version, m.Name)
		switch format {
		case FormatGolangMigrate:
			out = append(out,
				File{base + ".up.sql", e.header("up") + "\n" + e.up()},
				File{base + ".down.sql", e.header("down") + "\n" + e.down()})
		case FormatGoose:
			out = append(out, File{base + ".sql", e.header("") + "\n-- +goose Up\n-- +goose StatementBegin\n" + e.up() +
				"-- +goose StatementEnd\n\n-- +goose Down\n-- +goose StatementBegin\n" + e.down() + "-- +goose StatementEnd\n"})
		}
	}
	return out, nil
}

type exporter struct {
	m      Migration
	prev   int64
	schema string
	tool   string
}

func (e exporter) header(direction string) string {
	what := "migration"
	if direction != "" {
		what = direction + " migration"
	}
	return fmt.Sprintf(`-- backlog's %s %04d_%s for %s, on schema %s.
-- Written by `+"`backlog migrate sql --format %s --schema %s`"+`: export again
-- rather than edit. Each direction is one statement: a DO block that runs
-- the migration under backlog's migration lock, with search_path set to the
-- schema, unless schema_migrations (backlog's own version table) says the
-- schema already has it, and records the version there. backlog's own
-- migrate, goose and golang-migrate can so take turns on one schema
-- without running a migration twice.
`, what, e.m.Version, e.m.Name, e.tool, e.schema, e.tool, e.schema)
}

// open is the start of both blocks: the lock, then search_path.
func (e exporter) open(create bool) string {
	ident := pgx.Identifier{e.schema}.Sanitize()
	var b strings.Builder
	fmt.Fprintf(&b, `DO %s
DECLARE
    v_path    text := current_setting('search_path');
    v_version bigint;
    v_dirty   boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('backlog.migrate'), hashtext(%s));
`, blockTag, literal(e.schema))
	if create {
		fmt.Fprintf(&b, `    IF to_regnamespace(%s) IS NULL THEN
        CREATE SCHEMA %s;
    END IF;
`, literal(ident), ident)
	}
	fmt.Fprintf(&b, `    PERFORM set_config('search_path', %s, true);
`, literal(ident))
	return b.String()
}

// record is the end of the branch that ran the migration.
func (e exporter) record(version int64) string {
	var b strings.Builder
	b.WriteString("        DELETE FROM schema_migrations;\n")
	if version > 0 {
		fmt.Fprintf(&b, "        INSERT INTO schema_migrations (version, dirty) VALUES (%d, false);\n", version)
	}
	fmt.Fprintf(&b, "        COMMENT ON TABLE schema_migrations IS %s;\n", literal(markerPrefix+e.tool))
	return b.String()
}

func (e exporter) close() string {
	return "    PERFORM set_config('search_path', v_path, true);\nEND\n" + blockTag + ";\n"
}

func (e exporter) up() string {
	name := literal(fmt.Sprintf("%d (%s)", e.m.Version, e.m.Name))
	var b strings.Builder
	b.WriteString(e.open(true))
	fmt.Fprintf(&b, `    IF to_regclass('schema_migrations') IS NULL THEN
        %s;
    END IF;
    SELECT version, dirty INTO v_version, v_dirty FROM schema_migrations LIMIT 1;
    IF v_version >= %d AND NOT v_dirty THEN
        RAISE NOTICE 'backlog: schema %% already has migration %%: skipped', %s, %s;
    ELSIF NOT coalesce(v_dirty, false) AND coalesce(v_version, 0) <> %d THEN
        RAISE EXCEPTION 'backlog: migration %% needs schema %% at version %d, it is at version %%', %s, %s, coalesce(v_version, 0)
            USING HINT = 'backlog migrate status shows where the schema stands; if files exported by an older backlog '
                'applied the earlier migrations, backlog migrate up records their version (and applies what is missing).';
    ELSE
        EXECUTE %s
%s
%s;
`, versionTableDDL, e.m.Version, literal(e.schema), name, e.prev, e.prev, name, literal(e.schema),
		sqlTag, strings.TrimRight(e.m.SQL, "\n"), sqlTag)
	b.WriteString(e.record(e.m.Version))
	b.WriteString("    END IF;\n")
	b.WriteString(e.close())
	return b.String()
}

func (e exporter) down() string {
	name := literal(fmt.Sprintf("%d (%s)", e.m.Version, e.m.Name))
	var b strings.Builder
	b.WriteString(e.open(false))
	fmt.Fprintf(&b, `    IF to_regclass('schema_migrations') IS NULL THEN
        RAISE EXCEPTION 'backlog: schema %% has no schema_migrations table, so whether it has migration %% is unknown', %s, %s
            USING HINT = 'if files exported by an older backlog applied it, backlog migrate up records the version first.';
    END IF;
    SELECT version, dirty INTO v_version, v_dirty FROM schema_migrations LIMIT 1;
    IF NOT coalesce(v_dirty, false) AND coalesce(v_version, 0) > %d THEN
        RAISE EXCEPTION 'backlog: schema %% is at version %%: revert the newer migrations before migration %%', %s, v_version, %s;
    ELSIF NOT coalesce(v_dirty, false) AND coalesce(v_version, 0) < %d THEN
        RAISE NOTICE 'backlog: schema %% does not have migration %% (it is at version %%): nothing to revert', %s, %s, coalesce(v_version, 0);
    ELSE
        EXECUTE %s
%s
%s;
`, literal(e.schema), name, e.m.Version, literal(e.schema), name, e.m.Version, literal(e.schema), name,
		sqlTag, strings.TrimRight(e.m.Down, "\n"), sqlTag)
	b.WriteString(e.record(e.prev))
	b.WriteString("    END IF;\n")
	b.WriteString(e.close())
	return b.String()
}
