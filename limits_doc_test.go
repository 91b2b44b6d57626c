package backlog

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The package doc's "Limits and defaults" is the one place that lists
// every limit and default: each line is checked against the constant it
// states, so changing a value without the doc fails here.
func TestDocStatesEveryLimitAndDefault(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", " ")), " ")
	n := func(v int) string { // 10000 → "10,000"
		s := fmt.Sprint(v)
		for i := len(s) - 3; i > 0; i -= 3 {
			s = s[:i] + "," + s[i:]
		}
		return s
	}
	d := func(v time.Duration) string {
		switch {
		case v%(24*time.Hour) == 0 && v > 24*time.Hour:
			return fmt.Sprintf("%d days", v/(24*time.Hour))
		case v%time.Hour == 0:
			return fmt.Sprintf("%d hours", v/time.Hour)
		case v == time.Minute:
			return "1 minute"
		case v%time.Second == 0:
			return fmt.Sprintf("%d s", v/time.Second)
		}
		return fmt.Sprintf("%d ms", v/time.Millisecond)
	}
	for _, want := range []string{
		fmt.Sprintf("type, and a schedule's name: 1 to %s bytes", n(maxTypeBytes)),
		fmt.Sprintf("tags: at most %d, each key and value at most %d bytes, their JSON encoding at most %s bytes",
			maxTags, maxTagBytes, n(maxTagsBytes)),
		fmt.Sprintf("keys: at most %d bytes", maxKeyBytes),
		fmt.Sprintf("args: at most %d MiB", MaxArgsBytes>>20),
		fmt.Sprintf("result: at most %d KiB", MaxResultBytes>>10),
		fmt.Sprintf("progress: at most %d KiB", MaxProgressBytes>>10),
		fmt.Sprintf("metadata: at most %s bytes", n(MaxMetadataBytes)),
		fmt.Sprintf("[Priority]: %d, first, to %d, last ([MinPriority], [MaxPriority]); defaults to %d ([DefaultPriority])",
			MinPriority, MaxPriority, DefaultPriority),
		fmt.Sprintf("[MaxAttempts]: 1 to %s; defaults to %d ([DefaultMaxAttempts])", n(maxAttemptsLimit), DefaultMaxAttempts),
		fmt.Sprintf("[DependsOn]: at most %s prerequisites", n(maxDependsOn)),
		fmt.Sprintf("[CatchUp]: 1 to %s; defaults to 1", n(maxCatchUp)),
		fmt.Sprintf("at most %s ([MaxBatchJobs])", n(MaxBatchJobs)),
		fmt.Sprintf("defaults to %q ([DefaultSchema])", DefaultSchema),
		fmt.Sprintf("[WithLease]: at least 1 s; defaults to %s", d(defaultLease)),
		fmt.Sprintf("[WithWorkerID]: at most %d bytes", maxWorkerIDBytes),
		fmt.Sprintf("[WithPollInterval]: %s; [WithPollJitter]: %s", d(defaultPollInterval), d(defaultPollJitter)),
		fmt.Sprintf("[WithNotifyInterval]: %d", defaultNotifyInterval),
		fmt.Sprintf("[WithSweepInterval]: %s", d(defaultSweepInterval)),
		fmt.Sprintf("[WithCleanInterval]: %s", d(defaultCleanInterval)),
		fmt.Sprintf("[WithRetention]: %s for completed jobs, %s for failed and cancelled ones; each at most %s",
			d(defaultKeepCompleted), d(defaultKeepFailed), d(maxRetention)),
		fmt.Sprintf("[DefaultBackoff] (%s, doubling, capped at 1 h, ±%d %% jitter)",
			d(DefaultBackoff.Initial), int(DefaultBackoff.Randomization*100)),
		fmt.Sprintf("[Concurrency]: %d; [Prefetch]: %s; [GracePeriod]: %s", defaultConcurrency, n(defaultPrefetch), d(defaultGracePeriod)),
		fmt.Sprintf("Concurrency, KeyConcurrency, Rate and Burst: at most 2^%d", 30),
		fmt.Sprintf("Per: whole milliseconds from %s to %s", d(minRatePer), d(maxRatePer)),
		fmt.Sprintf("Burst: defaults to the starts of %s at the rate", d(defaultSpan)),
		fmt.Sprintf("pages of %d by default ([DefaultListLimit]), at most %d ([MaxListLimit]); [Filter].IDs at most %d",
			DefaultListLimit, MaxListLimit, maxListIDs),
		fmt.Sprintf("at most %d prerequisites and %d dependents listed, and the chain of the key at most %d; more dependents counted up to %s",
			maxGraphNeighbours, maxGraphNeighbours, maxGraphNeighbours, n(maxGraphCount)),
		fmt.Sprintf("finished jobs of the last %s ([StatsWindow])", d(StatsWindow)),
		fmt.Sprintf("older than [OldTransactionWarning] (%s)", d(OldTransactionWarning)),
		fmt.Sprintf("hour counts for %s", d(maxRetention)),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("doc.go's Limits and defaults does not say %q", want)
		}
	}
	if maxLimit != 1<<30 || DefaultBackoff.Max != time.Hour || DefaultBackoff.Multiplier != 2 {
		t.Errorf("doc.go's Limits and defaults states 2^30 and a backoff doubling up to 1 h: update it")
	}
}
