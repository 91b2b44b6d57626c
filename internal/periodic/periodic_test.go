package periodic

import (
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"
)

// Every plans at multiples of the interval since the Unix epoch, as the
// documentation says: weekly plans fall on Thursdays 00:00 UTC (1970-01-01
// was a Thursday), not on Mondays (Go's zero time).
func TestEveryPlansAlignToTheUnixEpoch(t *testing.T) {
	p := Every(7 * 24 * time.Hour)
	n := p.Next(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)) // a Monday
	require.Equal(t, time.Thursday, n.Weekday())
	require.Equal(t, time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), n.UTC())
	require.Equal(t, time.Unix(90, 0), Every(90*time.Second).Next(time.Unix(0, 1)))
	require.Equal(t, time.Unix(0, 0), Every(90*time.Second).Next(time.Unix(-1, 0)))
}

// After long downtime only the most recent plans are computed, whatever
// the schedule and however long ago the last plan was.
func TestMissedPlansAfterLongDowntime(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC)
	last := now.Add(-30 * 365 * 24 * time.Hour)
	s, err := cron.ParseStandard("* * * * *")
	require.NoError(t, err)
	start := time.Now()
	got := missedPlans(Cron{S: s}, last, now, 3)
	require.Less(t, time.Since(start), time.Second)
	require.Equal(t, []time.Time{now.Truncate(time.Minute).Add(-2 * time.Minute), now.Truncate(time.Minute).Add(-time.Minute), now.Truncate(time.Minute)}, got)

	got = missedPlans(Every(time.Second), now.Add(-12*24*time.Hour), now, 1)
	require.Equal(t, []time.Time{now}, got, "@every 1s after 12 days down: the latest plan")
	require.Empty(t, missedPlans(Cron{S: s}, now.Add(-time.Second), now, 1))
}
