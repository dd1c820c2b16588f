package testdb

import (
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// A goroutine started from a labelled one, and one that it starts in
// turn, are listed under the label; one started before is not, nor is
// the caller.
func TestLabelledListsTheGoroutinesStartedUnderALabel(t *testing.T) {
	const value = "TestLabelled#1"
	before, done, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { <-before }()
	defer close(before)
	pprof.Do(context.Background(), pprof.Labels(goroutineLabel, value), func(context.Context) {
		go func() {
			go func() { <-done; close(ended) }()
			<-done
		}()
	})
	WaitFor(t, 10*time.Second, func() bool { return strings.Count(Labelled(value), "goroutines_test.go") == 2 },
		"the two labelled goroutines were not listed: %s", Labelled(value))
	if got := Labelled("TestLabelled#11"); got != "" {
		t.Errorf("another label's list = %s, want none", got)
	}
	pprof.Do(context.Background(), pprof.Labels(goroutineLabel, value), func(context.Context) {
		if got := Labelled(value); strings.Count(got, "goroutines_test.go") != 2 {
			t.Errorf("a labelled caller's list = %s, want the two goroutines alone", got)
		}
	})
	close(done)
	<-ended
	WaitFor(t, 10*time.Second, func() bool { return Labelled(value) == "" }, "ended goroutines still listed: %s", Labelled(value))
}
