package testdb

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// goroutineLabel is the pprof label that CheckGoroutines gives a test's
// goroutine, and with it every goroutine started from it.
const goroutineLabel = "advisorylock-test"

var checks atomic.Int64

// CheckGoroutines fails t if a goroutine that t started is still running
// once t's other cleanups are done (call it first, so that its check runs
// after them: closing pools, proxies, clusters). It counts t's goroutines
// alone, so a test that checks may run beside others: it gives t's
// goroutine a pprof label, which every goroutine started from a labelled
// one inherits (so do t's subtests, and what they start). What a timer
// starts (time.AfterFunc's function) carries no label, nor does what runs
// on goroutines that existed before the call (a database/sql opener of a
// pool opened earlier); TestMain's goleak check sees those, at the end.
// A goroutine on its way out has 5 s to go.
func CheckGoroutines(t testing.TB) {
	t.Helper()
	value := Mark(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			left := Labelled(value)
			if left == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines left running:\n%s", left)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// Mark gives the caller's goroutine a label of its own, and returns it:
// Labelled lists, under it, the goroutines that the caller starts from
// then on, and those they start. A later Mark on the same goroutine
// replaces it (so CheckGoroutines would no longer see what follows).
func Mark(t testing.TB) string {
	value := fmt.Sprintf("%s#%d", t.Name(), checks.Add(1))
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(goroutineLabel, value)))
	return value
}

// Labelled returns the stacks of the running goroutines that carry
// CheckGoroutines' label with value, but the caller's, or "" if there
// are none.
func Labelled(value string) string {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return "reading the goroutine profile: " + err.Error()
	}
	want := fmt.Sprintf("%q:%q", goroutineLabel, value)
	var left []string
	// After a line of totals, records separated by blank lines: a count
	// and PCs, a labels line where the goroutines have labels, then a
	// frame a line.
	_, recs, _ := strings.Cut(buf.String(), "\n")
	for _, rec := range strings.Split(recs, "\n\n") {
		_, rest, _ := strings.Cut(rec, "\n")
		labels, _, _ := strings.Cut(rest, "\n")
		if !strings.HasPrefix(labels, "# labels: ") || !strings.Contains(labels, want) {
			continue
		}
		if strings.Contains(rec, "runtime/pprof.writeGoroutine") {
			continue // the caller's own
		}
		left = append(left, rec)
	}
	return strings.Join(left, "\n\n")
}
