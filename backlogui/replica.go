package backlogui

import (
	"context"
	"fmt"
	"time"

	"github.com/backlogq/backlog"
)

// replicaView is the header's note on where the pages' data comes from,
// for a Queue with a read pool (backlog.WithReadPool).
type replicaView struct {
	Text  string // short, in the header
	Title string // the longer explanation (tooltip)
	Warn  bool   // behind, paused or unreachable
}

// replicaOf asks the Queue how far behind its read pool is: nil without a
// read pool (no query then). The status is asked on every page and every
// refresh of the overview; it costs one statement on the primary and one
// on the standby, neither reading a table.
func (h *handler) replicaOf(ctx context.Context) *replicaView {
	st, err := h.q.ReadPoolStatus(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return &replicaView{Text: "replica unreachable", Warn: true,
			Title: "The pages read a replica (WithReadPool) that does not answer: " + err.Error()}
	}
	return replicaText(st)
}

// replicaText words a read pool's status.
func replicaText(st *backlog.ReadPoolStatus) *replicaView {
	switch {
	case !st.Configured:
		return nil
	case !st.Standby:
		return &replicaView{Text: "reads: a primary",
			Title: "The pages read a separate pool whose server is not a standby: they are never behind."}
	}
	behind := "behind"
	switch {
	case st.Lag > 0:
		behind = fmtDur(st.Lag) + " behind"
	case st.BytesBehind > 0:
		behind = fmt.Sprintf("%d bytes of WAL behind", st.BytesBehind)
	}
	last := "no transaction replayed since it started"
	if !st.LastReplayed.IsZero() {
		last = "last replayed commit at " + st.LastReplayed.UTC().Format(time.RFC3339)
	}
	switch {
	case st.ReplayPaused:
		return &replicaView{Text: "replica paused, " + behind, Warn: true,
			Title: "The pages read a hot standby whose replay is paused (pg_wal_replay_pause): they show the queue as it was then; " + last + "."}
	case st.CaughtUp:
		return &replicaView{Text: "replica caught up",
			Title: "The pages read a hot standby that had replayed everything the primary had written when the page was made (" + last + ")."}
	default:
		return &replicaView{Text: "replica " + behind, Warn: true,
			Title: fmt.Sprintf("The pages read a hot standby %d bytes of WAL behind the primary; %s. Jobs enqueued, claimed or finished since may not show yet. The lag counts any idle time of the primary before the commit being replayed, so it is an upper bound.", st.BytesBehind, last)}
	}
}
