package backlog

import (
	"context"
	"encoding/json"
	"testing"
)

type benchTypedArgs struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
	N       int    `json:"n"`
}

func (benchTypedArgs) Kind() string { return "email.send" }

// BenchmarkBuildBatch measures validating a batch of 100 jobs into rows:
// string specs (the resolve step costs them one type assertion each),
// the same args as a typed spec, and a typed spec with default options.
func BenchmarkBuildBatch(b *testing.B) {
	args := benchTypedArgs{To: "ada@example.com", Subject: "Welcome", N: 42}
	run := func(b *testing.B, spec JobSpec) {
		specs := make([]JobSpec, 100)
		for i := range specs {
			specs[i] = spec
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := buildBatch(resolveAll(specs)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("string", func(b *testing.B) {
		run(b, JobSpec{Type: "email.send", Args: map[string]any{"to": "ada@example.com", "subject": "Welcome", "n": 42}, Options: []EnqueueOption{MaxAttempts(5)}})
	})
	b.Run("string-struct", func(b *testing.B) {
		run(b, JobSpec{Type: "email.send", Args: struct {
			To      string `json:"to"`
			Subject string `json:"subject"`
			N       int    `json:"n"`
		}(args), Options: []EnqueueOption{MaxAttempts(5)}})
	})
	b.Run("typed", func(b *testing.B) { run(b, Spec(args, MaxAttempts(5))) })
}

// BenchmarkHandlerDispatch measures a Mux's dispatch of one job to a
// string handler and to a typed one (which decodes the args).
func BenchmarkHandlerDispatch(b *testing.B) {
	raw, _ := json.Marshal(benchTypedArgs{To: "ada@example.com", Subject: "Welcome", N: 42})
	job := &Job{Type: "email.send", Args: raw}
	ctx := context.Background()
	run := func(b *testing.B, m *Mux) {
		b.ReportAllocs()
		for b.Loop() {
			if err := m.Work(ctx, job); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("string", func(b *testing.B) {
		m := NewMux()
		m.HandleFunc("email.send", func(context.Context, *Job) error { return nil })
		run(b, m)
	})
	b.Run("typed", func(b *testing.B) {
		m := NewMux()
		HandleArgs(m, func(context.Context, *Job, benchTypedArgs) error { return nil })
		run(b, m)
	})
}
