package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// Bounds of the tests that a release wakes a waiter.
const (
	// HandoffWait bounds every wait of a handoff test: for a listener to
	// appear, for a waiter's outcome.
	HandoffWait = 30 * time.Second
	// FarPoll is a poll interval whose first poll comes 5 s after a
	// LeaseLock's wait starts at the earliest: a waiter that has the lease
	// well within that was woken, not polled.
	FarPoll = 10 * time.Second
	// Promptly bounds a woken handoff: generous for a loaded machine, and
	// still well under FarPoll's first poll.
	Promptly = 2 * time.Second
)

var appSeq atomic.Int64

// AppDSN returns PostgresDSN with an application_name of its own, made
// from prefix, by which the sessions opened with it (a listener's among
// them) are found, and that name.
func AppDSN(t testing.TB, prefix string) (dsn, app string) {
	t.Helper()
	app = fmt.Sprintf("%s%d_%d", prefix, time.Now().UnixNano()%1e9, appSeq.Add(1))
	return PostgresDSN(t) + "&application_name=" + app, app
}

// Waiting starts acquire in a goroutine, with HandoffWait to get the
// lock, releases what it got, and returns where the outcome (the
// acquire's error, else the release's) arrives.
func Waiting[G interface{ Release(context.Context) error }](acquire func(ctx context.Context) (G, error)) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), HandoffWait)
		defer cancel()
		g, err := acquire(ctx)
		if err == nil {
			err = g.Release(context.Background())
		}
		got <- err
	}()
	return got
}

// HandedOff waits for a waiter's outcome from got (see Waiting), fails t
// if it is an error or does not come within HandoffWait, and returns how
// long after since it came.
func HandedOff(t testing.TB, got <-chan error, since time.Time) time.Duration {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		return time.Since(since)
	case <-time.After(HandoffWait):
		t.Fatalf("the waiter never got the lock")
		return 0
	}
}

// ListenerPID waits until a PostgreSQL session of application app, other
// than pid old, has run a LISTEN and sits idle (listening), and returns
// its pid.
func ListenerPID(t testing.TB, admin *sql.DB, app string, old int) int {
	t.Helper()
	deadline := time.Now().Add(HandoffWait)
	for time.Now().Before(deadline) {
		var pid int
		err := admin.QueryRow(`SELECT pid FROM pg_stat_activity
WHERE application_name = $1 AND query LIKE 'LISTEN %' AND state = 'idle' AND pid <> $2`, app, old).Scan(&pid)
		if err == nil {
			return pid
		}
		if err != sql.ErrNoRows {
			t.Fatalf("looking for the listener of %s: %v", app, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the server for the event
	}
	t.Fatalf("no listener of %s within %v", app, HandoffWait)
	return 0
}

// KillListener terminates the listening session of app (see ListenerPID),
// waits until another listens, and fails t if the waiter whose outcome
// goes to got returned meanwhile: the lock it waits for is still held.
func KillListener(t testing.TB, admin *sql.DB, app string, got <-chan error) {
	t.Helper()
	pid := ListenerPID(t, admin, app, 0)
	var killed bool
	if err := admin.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, killed, err)
	}
	ListenerPID(t, admin, app, pid)
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the lock was held: %v", err)
	default:
	}
}

// WokenBy calls release and fails t unless the waiter's outcome comes to
// got within Promptly after it, as a woken waiter's does (its first poll
// comes after FarPoll/2). what says whose waiter, in the failure.
func WokenBy(t testing.TB, got <-chan error, release func() error, what string) {
	t.Helper()
	released := time.Now()
	if err := release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	if d := HandedOff(t, got, released); d > Promptly {
		t.Fatalf("%s got the lock %v after the release; woken, it takes a few round trips (its first poll comes after %v)", what, d, FarPoll/2)
	}
}

// HoldAndWait takes the lock with hold, then starts wait on it in a
// goroutine (see Waiting); it returns the holder's release and where the
// waiter's outcome arrives.
func HoldAndWait[H, W interface{ Release(context.Context) error }](t testing.TB, hold func(context.Context) (H, error), wait func(context.Context) (W, error)) (release func() error, got <-chan error) {
	t.Helper()
	g, err := hold(context.Background())
	if err != nil {
		t.Fatalf("taking the lock to hold: %v", err)
	}
	return func() error { return g.Release(context.Background()) }, Waiting(wait)
}
