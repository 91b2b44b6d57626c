package backlog

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
)

// Handler runs one attempt of a job. Returning nil completes the job; an
// error retries it with backoff until its attempts are used up; Permanent(err)
// fails it at once; Snooze(d) runs it again after d without spending an
// attempt. A panic is recovered and counts as an error. ctx is cancelled when
// the job's timeout passes, its lease is lost, it is cancelled, or Work stops
// after its grace period; context.Cause(ctx) tells which.
//
// Delivery is at least once: a handler can run again for an attempt whose
// outcome was not recorded (its process died), so handlers must be
// idempotent.
type Handler interface {
	Work(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

// Work calls f(ctx, job).
func (f HandlerFunc) Work(ctx context.Context, job *Job) error { return f(ctx, job) }

// HandleJSON returns a Handler that decodes the job's JSON args into a T and
// calls f. Args that do not decode fail the job permanently with an error
// naming T.
func HandleJSON[T any](f func(ctx context.Context, job *Job, args T) error) Handler {
	return HandlerFunc(func(ctx context.Context, job *Job) error {
		var args T
		if err := json.Unmarshal(job.Args, &args); err != nil {
			return Permanent(fmt.Errorf("decoding args of %s into %T: %w", job.Type, args, err))
		}
		return f(ctx, job, args)
	})
}

// Mux routes jobs to handlers by exact job type, like http.ServeMux routes
// requests by path. A job whose type has no handler fails permanently with a
// clear error. A Mux is safe for concurrent use, but handlers registered
// after Work started are not claimed by that Work call.
type Mux struct {
	mu     sync.RWMutex
	routes map[string]route
}

type route struct {
	h       Handler
	backoff *Backoff
	args    string // the args type of a HandleArgs registration ("": none)
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{routes: map[string]route{}} }

// HandleOption configures one Mux registration. RetryBackoff is one.
type HandleOption interface{ applyHandle(*route) }

// Handle registers h for jobs of type typ. It panics if typ is invalid, h is
// nil, or typ is already registered (like http.ServeMux), by Handle,
// HandleFunc or HandleArgs.
func (m *Mux) Handle(typ string, h Handler, opts ...HandleOption) {
	if err := validateType(typ); err != nil {
		panic(err)
	}
	if h == nil {
		panic(invalid("handler", "nil handler for type %q", typ))
	}
	m.handle(typ, h, "", opts)
}

// handle registers h for typ; args is the args type of a HandleArgs
// registration ("" for Handle's).
func (m *Mux) handle(typ string, h Handler, args string, opts []HandleOption) {
	r := route{h: h, args: args}
	for _, o := range opts {
		o.applyHandle(&r)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, dup := m.routes[typ]; dup {
		panic(fmt.Sprintf("backlog: handler for type %q registered twice: %s, then %s", typ, old.describe(), r.describe()))
	}
	m.routes[typ] = r
}

// describe names the registration r for a message.
func (r route) describe() string {
	if r.args == "" {
		return "by Handle"
	}
	return "by HandleArgs for args " + r.args
}

// HandleFunc registers f for jobs of type typ.
func (m *Mux) HandleFunc(typ string, f func(ctx context.Context, job *Job) error, opts ...HandleOption) {
	if f == nil {
		panic(invalid("handler", "nil handler for type %q", typ))
	}
	m.Handle(typ, HandlerFunc(f), opts...)
}

// Types returns the registered job types, sorted.
func (m *Mux) Types() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.routes))
	for t := range m.routes {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Work runs the handler registered for job.Type.
func (m *Mux) Work(ctx context.Context, job *Job) error {
	m.mu.RLock()
	r, ok := m.routes[job.Type]
	m.mu.RUnlock()
	if !ok {
		return Permanent(fmt.Errorf("no handler registered for job type %q", job.Type))
	}
	return r.h.Work(ctx, job)
}

func (m *Mux) backoffFor(typ string) *Backoff {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.routes[typ].backoff
}
