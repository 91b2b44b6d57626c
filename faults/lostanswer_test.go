package faults_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog"
	"github.com/backlogq/backlog/internal/testdb"
)

// answerCutter is a TCP proxy that speaks enough of PostgreSQL's protocol
// to lose the answer to a commit: once a client sent a statement whose
// text contains trigger, the server's messages on that connection are
// held until a ReadyForQuery; one saying "in transaction" lets them
// through, one saying "idle" (the transaction has ended: committed, as
// the server saw it) is dropped with all it held, and the connection is
// cut. The client never learns whether its commit landed.
type answerCutter struct {
	t       *testing.T
	ln      net.Listener
	target  string
	trigger []byte

	mu    sync.Mutex
	armed int // cuts still to make
	cuts  int
	wg    sync.WaitGroup
	conns map[net.Conn]struct{}
}

func newAnswerCutter(t *testing.T, trigger string) *answerCutter {
	t.Helper()
	cfg, err := pgconn.ParseConfig(testdb.URL())
	require.NoError(t, err)
	require.NotEqual(t, byte('/'), cfg.Host[0], "the cutter proxies TCP only")
	c := &answerCutter{t: t, target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), trigger: []byte(trigger),
		conns: map[net.Conn]struct{}{}}
	c.ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c.wg.Add(1)
	go c.accept()
	t.Cleanup(c.close)
	return c
}

// arm makes the cutter lose the answers of the next n transactions that
// run the trigger.
func (c *answerCutter) arm(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed += n
}

func (c *answerCutter) made() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

func (c *answerCutter) route(cfg *pgxpool.Config) {
	a := c.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = a.IP.String(), uint16(a.Port)
	cfg.ConnConfig.Fallbacks = nil
}

func (c *answerCutter) close() {
	_ = c.ln.Close()
	c.mu.Lock()
	for conn := range c.conns {
		_ = conn.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
}

func (c *answerCutter) track(conns ...net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		return false
	}
	for _, x := range conns {
		c.conns[x] = struct{}{}
	}
	return true
}

func (c *answerCutter) accept() {
	defer c.wg.Done()
	for {
		client, err := c.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", c.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c.track(client, server)
		var triggered sync.Mutex // guards fired
		fired := false
		cut := func() {
			_ = client.Close()
			_ = server.Close()
		}
		c.wg.Add(2)
		go func() { // client → server
			defer c.wg.Done()
			defer cut()
			first := true
			for {
				msg, err := readMsg(client, first)
				first = false
				if err != nil {
					return
				}
				if bytes.Contains(msg, c.trigger) {
					triggered.Lock()
					fired = true
					triggered.Unlock()
				}
				if _, err := server.Write(msg); err != nil {
					return
				}
			}
		}()
		go func() { // server → client
			defer c.wg.Done()
			defer cut()
			var held []byte
			for {
				msg, err := readMsg(server, false)
				if err != nil {
					return
				}
				triggered.Lock()
				on := fired
				triggered.Unlock()
				if !on {
					if _, err := client.Write(msg); err != nil {
						return
					}
					continue
				}
				held = append(held, msg...)
				if msg[0] != 'Z' {
					continue
				}
				if msg[5] == 'I' { // the transaction ended
					triggered.Lock()
					fired = false
					triggered.Unlock()
					c.mu.Lock()
					drop := c.armed > 0
					if drop {
						c.armed--
						c.cuts++
					}
					c.mu.Unlock()
					if drop {
						return // the answer is lost: cut
					}
				}
				if _, err := client.Write(held); err != nil {
					return
				}
				held = held[:0]
			}
		}()
	}
}

// readMsg reads one protocol message whole: the startup message has no
// type byte.
func readMsg(r io.Reader, startup bool) ([]byte, error) {
	head := 5
	if startup {
		head = 4
	}
	b := make([]byte, head)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(b[head-4:])) - 4
	if n < 0 || n > 1<<30 {
		return nil, io.ErrUnexpectedEOF
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return append(b, body...), nil
}

// warnings collects the messages of a Queue's warnings and errors.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) containing(s string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

// TestLostCommitAnswerIsNotCalledRefused: the connection of the completer
// is cut after the server committed a batch of outcomes and before its
// answer arrived, several times. The outcomes were written; the queue must
// find that out (it asks the database whether the transaction committed)
// instead of writing them again, having them refused by their lease
// tokens, and warning "outcome refused: lease lost" for outcomes it wrote.
func TestLostCommitAnswerIsNotCalledRefused(t *testing.T) {
	requireFaults(t)
	const jobs, cuts = 40, 3
	e := newFEnv(t)
	ctx := context.Background()
	cutter := newAnswerCutter(t, `."finish"(`)
	pool := e.pool("lost", 8, cutter.route)
	w := &warnings{}
	q := e.queue(pool, "lost", backlog.WithLogger(slog.New(w)), backlog.WithPollInterval(time.Second))
	var mu sync.Mutex
	runs := map[string]int{}
	release := make(chan struct{})
	work(t, q, backlog.HandlerFunc(func(ctx context.Context, j *backlog.Job) error {
		mu.Lock()
		runs[j.ID.String()+"/"+strconv.Itoa(j.Attempt)]++
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}), backlog.Concurrency(jobs), backlog.Types("lost"))
	specs := make([]backlog.JobSpec, jobs)
	for i := range specs {
		specs[i] = backlog.JobSpec{Type: "lost"}
	}
	ids, err := e.q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Second)
	for e.count(`SELECT count(*) FROM `+e.table("jobs")+` WHERE state = 'running'`) < jobs {
		require.True(t, time.Now().Before(deadline), "the jobs did not all start")
		<-time.After(10 * time.Millisecond)
	}
	cutter.arm(cuts)
	close(release) // the outcomes go to the completer in one or a few batches
	deadline = time.Now().Add(time.Minute)
	for _, id := range ids {
		for {
			info, err := e.q.Job(ctx, id)
			require.NoError(t, err)
			if info.State.Terminal() {
				require.Equal(t, backlog.StateCompleted, info.State)
				require.Equal(t, 1, info.Attempt, "job %s ran again", id)
				break
			}
			require.True(t, time.Now().Before(deadline), "job %s did not finish", id)
			<-time.After(10 * time.Millisecond)
		}
	}
	require.Positive(t, cutter.made(), "no commit answer was lost: the scenario did not happen")
	mu.Lock()
	for k, n := range runs {
		require.Equal(t, 1, n, "run %s", k)
	}
	mu.Unlock()
	require.Empty(t, w.containing("refused"), "outcomes that were written were reported refused")
	require.Empty(t, w.containing("not confirmed"), "the commits could be checked")
	t.Logf("%d commit answers lost; warnings: %v", cutter.made(), w.containing(""))
}
