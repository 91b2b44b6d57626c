package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/backlogq/backlog"
)

// connectTimeout bounds connecting when the URL sets no connect_timeout.
const connectTimeout = 10 * time.Second

// conn is the invocation's pools and Queues.
type conn struct {
	pool *pgxpool.Pool
	q    *backlog.Queue
	addr string // host:port, for messages
	// The read commands' Queue: with --read-url, one whose reads go to
	// readPool (backlog.WithReadPool); else q.
	readPool *pgxpool.Pool
	rq       *backlog.Queue
}

// url returns the connection string: --database-url, else $DATABASE_URL.
func (a *app) url() (string, error) {
	u := a.databaseURL
	if u == "" {
		u = os.Getenv("DATABASE_URL")
	}
	if u == "" {
		return "", usagef("no database: set DATABASE_URL or pass --database-url")
	}
	return u, nil
}

// readURL returns the read pool's connection string: --read-url, else
// $BACKLOG_READ_URL; "" for none.
func (a *app) readURL() string {
	if a.readURLFlag != "" {
		return a.readURLFlag
	}
	return os.Getenv("BACKLOG_READ_URL")
}

// poolConfig parses a connection string for one of the CLI's small pools.
func (a *app) poolConfig(flag, u string) (*pgxpool.Config, string, error) {
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, "", usagef("bad %s: %s", flag, a.redact(err.Error()))
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	cfg.MaxConns = 4
	addr := net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		addr = cfg.ConnConfig.Host // a Unix socket directory
	}
	return cfg, addr, nil
}

// open connects (once) and returns the Queue, without checking the schema.
func (a *app) open(ctx context.Context) (*conn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	u, err := a.url()
	if err != nil {
		return nil, err
	}
	cfg, addr, err := a.poolConfig("database URL", u)
	if err != nil {
		return nil, err
	}
	c := &conn{addr: addr}
	if c.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", c.addr, err)
	}
	if err := c.pool.Ping(ctx); err != nil {
		c.pool.Close()
		return nil, connectErr(c.addr, err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := []backlog.Option{backlog.WithSchema(a.schema), backlog.WithLogger(log), backlog.WithWorkerID("backlog-cli")}
	if c.q, err = backlog.New(ctx, c.pool, opts...); err != nil {
		c.pool.Close()
		return nil, err
	}
	c.rq = c.q
	if ru := a.readURL(); ru != "" {
		if err := c.openReads(ctx, a, ru, opts); err != nil {
			_ = c.q.Close()
			c.pool.Close()
			return nil, err
		}
	}
	a.conn = c
	return c, nil
}

// openReads opens the read pool (--read-url) and the read commands'
// Queue on it.
func (c *conn) openReads(ctx context.Context, a *app, u string, opts []backlog.Option) error {
	cfg, addr, err := a.poolConfig("read URL (--read-url or $BACKLOG_READ_URL)", u)
	if err != nil {
		return err
	}
	if c.readPool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("connecting to the read replica at %s: %w", addr, err)
	}
	if err := c.readPool.Ping(ctx); err != nil {
		c.readPool.Close()
		return fmt.Errorf("the read replica (--read-url): %w", connectErr(addr, err))
	}
	if c.rq, err = backlog.New(ctx, c.pool, append(opts, backlog.WithReadPool(c.readPool))...); err != nil {
		c.readPool.Close()
		return err
	}
	return nil
}

// readQueue is queue for the read commands (stats, list, show, paused,
// processes, schedules, limits, ui): with --read-url its reads go to the
// read replica. Commands that write use queue, whose reads stay on the
// primary (a limit set, then read back, must be found).
func (a *app) readQueue(ctx context.Context) (*backlog.Queue, error) {
	if _, err := a.queue(ctx); err != nil {
		return nil, err
	}
	return a.conn.rq, nil
}

// queue connects and returns the Queue of a migrated schema.
func (a *app) queue(ctx context.Context) (*backlog.Queue, error) {
	c, err := a.open(ctx)
	if err != nil {
		return nil, err
	}
	st, err := c.q.MigrationStatus(ctx)
	if err != nil {
		return nil, err
	}
	pending := st.Pending()
	switch {
	case st.Dirty:
		return nil, fmt.Errorf("schema %s is marked dirty at version %d (a migration failed half-way); fix it by hand", a.schema, st.Version)
	case st.Version == 0:
		return nil, fmt.Errorf("schema %s is not migrated; run `%s`", a.schema, a.migrateHint())
	case len(pending) > 0:
		return nil, fmt.Errorf("schema %s is at version %d of %d; run `%s`",
			a.schema, st.Version, pending[len(pending)-1].Version, a.migrateHint())
	}
	return c.q, nil
}

// migrateHint is the command that migrates the schema: with --schema for
// any but the default one (a schema name is a plain identifier, so it
// needs no quoting for the shell).
func (a *app) migrateHint() string {
	if a.schema == backlog.DefaultSchema {
		return "backlog migrate up"
	}
	return "backlog --schema " + a.schema + " migrate up"
}

// close releases the connection: the Queue first, which sends the
// notices of what was enqueued or retried.
func (a *app) close() {
	if a.conn == nil {
		return
	}
	if a.conn.rq != a.conn.q {
		_ = a.conn.rq.Close()
		a.conn.readPool.Close()
	}
	_ = a.conn.q.Close()
	a.conn.pool.Close()
	a.conn = nil
}

// connectErr says in one sentence why connecting failed.
func connectErr(addr string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("PostgreSQL at %s refused the connection: %s (SQLSTATE %s)", addr, pgErr.Message, pgErr.Code)
	}
	var sysErr *os.SyscallError
	var opErr *net.OpError
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		err = fmt.Errorf("cannot resolve %s: %s", dnsErr.Name, dnsErr.Err)
	} else if errors.As(err, &sysErr) {
		err = sysErr.Err // "connection refused", without "connect: "
	} else if errors.As(err, &opErr) && opErr.Err != nil {
		err = opErr.Err
	} else if errors.Is(err, context.DeadlineExceeded) {
		err = errors.New("timed out")
	} else {
		for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(u) {
			err = u
		}
	}
	return fmt.Errorf("cannot reach PostgreSQL at %s: %v", addr, err)
}

var (
	userinfoRE = regexp.MustCompile(`(://[^:/@\s]*):[^@\s]*@`)
	passwordRE = regexp.MustCompile(`(password=)\S+`)
)

// redact hides the database password in a message: the URL's, and any
// password=… setting.
func (a *app) redact(msg string) string {
	msg = userinfoRE.ReplaceAllString(msg, "$1:xxxxx@")
	u := a.databaseURL
	if u == "" {
		u = os.Getenv("DATABASE_URL")
	}
	for _, u := range []string{u, a.readURL()} {
		if p, err := url.Parse(u); err == nil && p.User != nil {
			if pw, ok := p.User.Password(); ok && pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
		}
		if cfg, err := pgconn.ParseConfig(u); err == nil && cfg.Password != "" {
			msg = strings.ReplaceAll(msg, cfg.Password, "xxxxx")
		}
	}
	return passwordRE.ReplaceAllString(msg, "${1}xxxxx")
}
