package store

import (
	"context"
	"time"
)

// FlushedWAL returns the WAL position the server has flushed, or nil when
// it is itself in recovery (a standby has no position of its own to give).
func (s *Store) FlushedWAL(ctx context.Context) (*string, error) {
	var lsn *string
	err := s.pool.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_flush_lsn()::text END`, Mode).
		Scan(&lsn)
	return lsn, err
}

// Replay is how far a server has replayed its primary's WAL.
type Replay struct {
	Standby bool // the server is in recovery
	Paused  bool // replay is paused (pg_wal_replay_pause)
	// Behind is the WAL between the position asked about and the last
	// replayed one (0 when replayed past it); nil when the server is no
	// standby or no position was given.
	Behind *int64
	// Lag is now() minus LastReplayed; nil when nothing was replayed.
	Lag *time.Duration
	// LastReplayed is the commit time of the last transaction replayed.
	LastReplayed *time.Time
}

// ReplayedTo reports how far the server has replayed, against the
// primary's position lsn (from FlushedWAL; nil for none).
func (s *Store) ReplayedTo(ctx context.Context, lsn *string) (Replay, error) {
	var (
		r     Replay
		lagMS *int64
	)
	err := s.pool.QueryRow(ctx, `
SELECT pg_is_in_recovery(),
       pg_is_in_recovery() AND pg_is_wal_replay_paused(),
       CASE WHEN pg_is_in_recovery() AND $1::text IS NOT NULL
            THEN greatest(pg_wal_lsn_diff($1::text::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint END,
       (extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint,
       pg_last_xact_replay_timestamp()`, Mode, lsn).
		Scan(&r.Standby, &r.Paused, &r.Behind, &lagMS, &r.LastReplayed)
	if lagMS != nil {
		d := time.Duration(*lagMS) * time.Millisecond
		r.Lag = &d
	}
	return r, err
}
