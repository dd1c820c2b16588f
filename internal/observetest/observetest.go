// Package observetest drives the lock events that every advisorylock
// Observer test checks (the core's recording observer, the OpenTelemetry
// and Prometheus adapters), so that all of them see the same history, and
// records events for tests that check them one by one.
package observetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/renewal"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Hooks let a test look at its observer while the scenario runs.
type Hooks struct {
	// WhileHeld runs while exactly one Lock of the scenario is held (the
	// first one, granted by TryLock), before anything else happens.
	WhileHeld func(t *testing.T)
	// Renewed reports whether the observer has seen a lease renewal; the
	// scenario holds its lease until it does.
	Renewed func() bool
}

// PostgresScenario runs, on db (PostgreSQL, any driver), with obs as the
// Observer of every lock it makes:
//
//  1. TryLock on lock A: acquired; then hooks.WhileHeld.
//  2. TryLock on A again: not_acquired (A is held).
//  3. LockTimeout(A, 50ms): timeout.
//  4. Lock on A, cancelled while it waits server-side: canceled, and its
//     connection discarded ("canceled").
//  5. Release of A: one hold of kind lock.
//  6. TryLock on lock B (keep-alive 50ms): acquired; its session is
//     terminated (pg_terminate_backend); the keep-alive finds it lost
//     ("session_ended"); Release discards its connection (for that cause,
//     "session_ended").
//  7. TryLock on LeaseLock C (TTL 1s): acquired; held until
//     hooks.Renewed reports a renewal; Release: one hold of kind lease.
//
// So an observer ends with acquires (lock: 2 acquired, 1 not_acquired,
// 1 timeout, 1 canceled; lease: 1 acquired), holds (lock 2, lease 1), held
// 0, one loss (lock, session_ended), two discards (canceled, session_ended) and at
// least one renewal (renewed).
func PostgresScenario(t *testing.T, db *sql.DB, obs advisorylock.Observer, hooks Hooks) {
	t.Helper()
	ctx := context.Background()
	opt := advisorylock.WithObserver(obs)
	a := must(advisorylock.New(db, testdb.UniqueName(t), opt))(t)

	g1 := must(a.TryLock(ctx))(t)
	if hooks.WhileHeld != nil {
		hooks.WhileHeld(t)
	}
	if _, err := a.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock: err = %v, want ErrNotAcquired", err)
	}
	if _, err := a.LockTimeout(ctx, 50*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout on a held lock: err = %v, want ErrTimeout", err)
	}
	CancelWaitingLock(t, db, a)
	if err := g1.Release(ctx); err != nil {
		t.Fatalf("release A: %v", err)
	}

	b := must(advisorylock.New(db, testdb.UniqueName(t), opt, advisorylock.WithKeepAlive(50*time.Millisecond)))(t)
	g2 := must(b.TryLock(ctx))(t)
	TerminateHolder(t, db, b)
	select {
	case <-g2.Lost():
	case <-time.After(testdb.DefaultWait):
		t.Fatalf("lock B not reported lost %v after its session was terminated", testdb.DefaultWait)
	}
	if err := g2.Release(ctx); err != nil {
		t.Fatalf("release of the lost lock B: %v", err)
	}

	c := must(advisorylock.NewLeaseLock(db, testdb.UniqueName(t), opt, advisorylock.WithLeaseTTL(time.Second)))(t)
	g3 := must(c.TryLock(ctx))(t)
	if hooks.Renewed != nil {
		testdb.WaitFor(t, 0, hooks.Renewed, "no lease renewal observed")
	}
	if err := g3.Release(ctx); err != nil {
		t.Fatalf("release C: %v", err)
	}
}

// CancelWaitingLock starts Lock on l (held elsewhere), waits until its
// session waits for the lock on the server, cancels it, and checks that
// it returned context.Canceled.
func CancelWaitingLock(t *testing.T, db *sql.DB, l *advisorylock.Lock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx)
		done <- err
	}()
	k := uint64(advisorylock.Key(l.Name()))
	q := fmt.Sprintf(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = %d AND objid = %d AND objsubid = 1`, k>>32, k&0xFFFFFFFF)
	testdb.WaitFor(t, 0, func() bool {
		var n int
		return db.QueryRow(q).Scan(&n) == nil && n > 0
	}, "Lock on %q never waited on the server", l.Name())
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: err = %v, want context.Canceled", err)
		}
	case <-time.After(testdb.DefaultWait):
		t.Fatal("cancelled Lock did not return")
	}
}

// TerminateHolder ends the server session that holds l.
func TerminateHolder(t *testing.T, db *sql.DB, l *advisorylock.Lock) {
	t.Helper()
	h, err := l.Holder(context.Background())
	if err != nil || h == nil || h.PID == 0 {
		t.Fatalf("Holder = %+v, %v; want the holding session", h, err)
	}
	if _, err := db.Exec(fmt.Sprintf("SELECT pg_terminate_backend(%d)", h.PID)); err != nil {
		t.Fatal(err)
	}
}

// must returns v, failing t on err: must(f())(t).
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// Event is one recorded event, with what a test compares most often.
type Event struct {
	advisorylock.Event
	Value string // an acquire's Outcome; a renewal's outcome (renewal.Outcome); a Cause otherwise ("" for a release)
	Span  int    // the acquire's number, as the context the event came with carries it
}

// Recorder is an Observer that records every event, and checks that each
// hold's events get the context its EventAcquireEnd returned.
type Recorder struct {
	mu     sync.Mutex
	events []Event
	starts int
}

type spanKey struct{}

// Observe records e. For EventAcquireStart it returns ctx numbered with
// the acquire; otherwise ctx.
func (r *Recorder) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := Event{Event: e, Span: span(ctx)}
	switch e.Type {
	case advisorylock.EventAcquireStart:
		r.starts++
		ev.Span = r.starts
		ctx = context.WithValue(ctx, spanKey{}, r.starts)
	case advisorylock.EventAcquireEnd:
		ev.Value = string(e.Outcome)
	case advisorylock.EventRenew:
		ev.Value = renewal.Outcome(e.Err)
	default:
		ev.Value = string(e.Cause)
	}
	r.events = append(r.events, ev)
	return ctx
}

func span(ctx context.Context) int {
	n, _ := ctx.Value(spanKey{}).(int)
	return n
}

// Events returns the events so far, optionally only those of the given
// types.
func (r *Recorder) Events(types ...advisorylock.EventType) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.events {
		if len(types) == 0 || slices.Contains(types, e.Type) {
			out = append(out, e)
		}
	}
	return out
}

// Count counts the events of type typ with value v.
func (r *Recorder) Count(typ advisorylock.EventType, v string) int {
	n := 0
	for _, e := range r.Events(typ) {
		if e.Value == v {
			n++
		}
	}
	return n
}
