package faults_test

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/backlogq/backlog/internal/testdb"
)

// proxy is a TCP proxy between a pool under test and PostgreSQL that can
// add latency, cut every connection, and blackhole traffic.
//
// Blackhole models a network partition: connections stay open, new ones
// are accepted, but no byte (and no close) passes in either direction; the
// bytes are held in order. Heal ends the partition: held bytes are
// delivered late, as TCP would after a partition that healed in time,
// so stale statements reach the server after everything else happened.
type proxy struct {
	t      *testing.T
	ln     net.Listener
	target string // "tcp" or "unix" address of PostgreSQL
	netw   string

	mu      sync.Mutex
	latency time.Duration // added to each direction
	open    chan struct{} // closed while traffic flows; replaced by Blackhole
	conns   map[*link]struct{}
	closed  bool
	wg      sync.WaitGroup
	done    chan struct{} // closed by Close
	accepts int
}

// link is one proxied client connection.
type link struct {
	client net.Conn
	cut    chan struct{} // closed by close

	mu     sync.Mutex
	server net.Conn // set once connected upstream
	closed bool
}

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.cut)
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// connected records the upstream connection; false (and s closed) when
// the link was cut meanwhile.
func (l *link) connected(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = s.Close()
		return false
	}
	l.server = s
	return true
}

// newProxy starts a proxy to the database of testdb.URL(), closed at
// cleanup.
func newProxy(t *testing.T) *proxy {
	t.Helper()
	cfg, err := pgconn.ParseConfig(testdb.URL())
	require.NoError(t, err)
	p := &proxy{t: t, netw: "tcp", target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
		open: make(chan struct{}), conns: map[*link]struct{}{}, done: make(chan struct{})}
	if len(cfg.Host) > 0 && cfg.Host[0] == '/' { // unix socket directory
		p.netw, p.target = "unix", cfg.Host+"/.s.PGSQL."+strconv.Itoa(int(cfg.Port))
	}
	close(p.open)
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the host and port clients connect to.
func (p *proxy) Addr() (string, uint16) {
	a := p.ln.Addr().(*net.TCPAddr)
	return a.IP.String(), uint16(a.Port)
}

// Route points a pool config at the proxy.
func (p *proxy) Route(cfg *pgxpool.Config) {
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Addr()
	cfg.ConnConfig.Fallbacks = nil
}

// SetLatency delays every chunk of bytes by d in each direction.
func (p *proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Blackhole stops all traffic until Heal.
func (p *proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already blackholed
	}
}

// Heal lets traffic flow again, held bytes first.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// CutAll closes every proxied connection (both ends) at once and returns
// how many there were.
func (p *proxy) CutAll() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
	return len(ls)
}

// Close stops the proxy, cuts every connection and waits for its
// goroutines.
func (p *proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// waitOpen blocks until traffic may flow; false if the link was cut.
func (p *proxy) waitOpen(l *link) bool {
	select {
	case <-p.gate():
		return true
	case <-l.cut:
		return false
	}
}

func (p *proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.t.Logf("proxy: accept: %v", err)
			}
			return
		}
		l := &link{client: c, cut: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[l] = struct{}{}
		p.accepts++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

// serve connects a link upstream (once traffic may flow) and pumps bytes
// both ways until either side closes or the link is cut.
func (p *proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	if !p.waitOpen(l) {
		return
	}
	s, err := net.DialTimeout(p.netw, p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !l.connected(s) { // cut while dialling
		return
	}
	var pumps sync.WaitGroup
	pumps.Go(func() { p.pump(l, l.client, s) })
	pumps.Go(func() { p.pump(l, s, l.client) })
	pumps.Wait()
}

type chunk struct {
	b   []byte
	at  time.Time // deliver no earlier than this
	eof bool
}

// pump copies src to dst through an ordered queue: a reader that stamps
// each chunk with its delivery time, and a writer that waits for that time
// and for the gate. EOF or an error closes the whole link, in order, after
// the bytes before it.
func (p *proxy) pump(l *link, src, dst net.Conn) {
	q := make(chan chunk, 256)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{b: buf[:n], at: time.Now().Add(p.delay())}:
				case <-l.cut:
					return
				}
			}
			if err != nil {
				select {
				case q <- chunk{eof: true, at: time.Now().Add(p.delay())}:
				case <-l.cut:
				}
				return
			}
		}
	})
	defer wg.Wait()
	for c := range q {
		if d := time.Until(c.at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.cut:
				t.Stop()
				return
			}
		}
		if !p.waitOpen(l) {
			return
		}
		if c.eof {
			l.close()
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close()
			return
		}
	}
}
