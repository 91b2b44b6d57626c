// Package waiters holds the Wait calls of a process, by job ID, for the
// listener to wake when a job's done notice arrives.
package waiters

import (
	"sync"

	"github.com/google/uuid"

	"github.com/backlogq/backlog/internal/run"
)

// Set maps job IDs to the Wait calls of this process. The zero value is
// ready to use.
type Set struct {
	mu sync.Mutex
	m  map[uuid.UUID][]chan struct{}
}

// Add registers a Wait call for id; the channel hears its wake-ups.
func (w *Set) Add(id uuid.UUID) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[uuid.UUID][]chan struct{}{}
	}
	ch := make(chan struct{}, 1)
	w.m[id] = append(w.m[id], ch)
	return ch
}

// Remove unregisters the Wait call of ch.
func (w *Set) Remove(id uuid.UUID, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.m[id]
	for i, c := range list {
		if c == ch {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.m, id)
	} else {
		w.m[id] = list
	}
}

// Wake signals every Wait call for id (never blocks).
func (w *Set) Wake(id uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[id] {
		run.Wake(ch)
	}
}
