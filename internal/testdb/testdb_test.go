package testdb

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records Fatalf instead of stopping the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

func TestWaitForReturnsOnceTrue(t *testing.T) {
	var calls atomic.Int32
	WaitFor(t, 0, func() bool { return calls.Add(1) >= 3 }, "never true")
	if calls.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", calls.Load())
	}
}

func TestWaitForFailsAtDeadline(t *testing.T) {
	f := &fakeTB{TB: t}
	start := time.Now()
	WaitFor(f, 30*time.Millisecond, func() bool { return false }, "thing %d", 7)
	if f.failed == "" || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("failed=%q after %v", f.failed, time.Since(start))
	}
	if want := "after 30ms: thing 7"; f.failed != want {
		t.Fatalf("message %q, want %q", f.failed, want)
	}
}

func TestUnavailableSkipsOrFails(t *testing.T) {
	t.Setenv(EnvRequireDB, "1")
	f := &fakeTB{TB: t}
	Unavailable(f, "testdb: nothing here")
	if f.failed == "" {
		t.Fatal("with ADVISORYLOCK_REQUIRE_DB=1 a missing database must fail")
	}
}

func TestSlowSkipsOnlyUnderShort(t *testing.T) {
	ran := false
	t.Run("slow", func(t *testing.T) {
		Slow(t, "a test of Slow")
		ran = true
	})
	if ran == testing.Short() {
		t.Fatalf("with -short=%v the slow subtest ran=%v", testing.Short(), ran)
	}
}
