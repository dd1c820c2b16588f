package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// constructors makes each kind of lock on name with opts, as a user would.
var constructors = map[string]func(db advisorylock.DB, name string, opts ...advisorylock.Option) error{
	"New": func(db advisorylock.DB, name string, opts ...advisorylock.Option) error {
		_, err := advisorylock.New(db, name, opts...)
		return err
	},
	"NewLeaseLock": func(db advisorylock.DB, name string, opts ...advisorylock.Option) error {
		_, err := advisorylock.NewLeaseLock(db, name, opts...)
		return err
	},
	"NewSemaphore": func(db advisorylock.DB, name string, opts ...advisorylock.Option) error {
		_, err := advisorylock.NewSemaphore(db, name, 2, opts...)
		return err
	},
	"NewElection": func(db advisorylock.DB, name string, opts ...advisorylock.Option) error {
		_, err := advisorylock.NewElection(db, name, opts...)
		return err
	},
	"NewFence": func(db advisorylock.DB, name string, opts ...advisorylock.Option) error {
		_, err := advisorylock.NewFence(db, name, opts...)
		return err
	},
}

// neverDialled is a handle whose server does not exist: a constructor that
// did I/O on it would hang or fail on the dial, not on its arguments.
func neverDialled(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", "host=192.0.2.1 connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestConstructorsRefuseAnEmptyName: two callers that forgot to set a
// name would share one lock; every constructor refuses "" without I/O.
func TestConstructorsRefuseAnEmptyName(t *testing.T) {
	db := neverDialled(t)
	for what, mk := range constructors {
		if err := mk(db, ""); err == nil || !strings.Contains(err.Error(), "empty name") {
			t.Errorf("%s(db, \"\") = %v, want an error saying the name is empty", what, err)
		}
	}
	if st := db.Stats(); st.OpenConnections != 0 {
		t.Fatalf("the constructors opened %d connections", st.OpenConnections)
	}
}

// TestConstructorsRefuseOptionsOutOfBounds: a value out of an option's
// bounds is an error naming the option, the value and the lock, not a
// silent clamp.
func TestConstructorsRefuseOptionsOutOfBounds(t *testing.T) {
	db := neverDialled(t)
	cases := []struct {
		opt  advisorylock.Option
		says string
		only []string // the constructors that take the option (nil: every one but NewFence)
	}{
		{advisorylock.WithLeaseTTL(0), "WithLeaseTTL(0s)", nil},
		{advisorylock.WithLeaseTTL(-5 * time.Second), "WithLeaseTTL(-5s)", nil},
		{advisorylock.WithLeaseTTL(time.Millisecond), "WithLeaseTTL(1ms)", nil},
		{advisorylock.WithLeaseTTL(25 * time.Hour), "WithLeaseTTL(25h0m0s)", nil},
		{advisorylock.WithMinHold(-time.Second), "WithMinHold(-1s)", []string{"New", "NewLeaseLock"}},
		{advisorylock.WithPollInterval(0), "WithPollInterval(0s)", nil},
		{advisorylock.WithReleaseTimeout(0), "WithReleaseTimeout(0s)", nil},
		{advisorylock.WithPoolWait(-time.Second), "WithPoolWait(-1s)", nil},
		{advisorylock.WithKeepAlive(-time.Second), "WithKeepAlive(-1s)", []string{"New", "NewSemaphore", "NewElection"}},
		{advisorylock.WithDeadHolderTimeout(-time.Second), "WithDeadHolderTimeout(-1s)", []string{"New", "NewSemaphore", "NewElection"}},
		// A keep-alive that would raise the dead-holder timeout unasked.
		{advisorylock.WithKeepAlive(30 * time.Second), "WithKeepAlive(30s)", []string{"New", "NewSemaphore", "NewElection"}},
	}
	for _, c := range cases {
		for what, mk := range constructors {
			if what == "NewFence" || (c.only != nil && !contains(c.only, what)) {
				continue
			}
			name := "bounds-" + what
			err := mk(db, name, c.opt)
			if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), name) {
				t.Errorf("%s with %s = %v, want an error naming %s and the lock", what, c.says, err, c.says)
			}
		}
	}
	// What stays valid: 0 turns the keep-alive, the dead-holder settings
	// and the window off; a long keep-alive with a dead-holder timeout
	// above it; a long release timeout raises the default.
	for what, mk := range constructors {
		if what == "NewFence" || what == "NewLeaseLock" {
			continue
		}
		for _, opts := range [][]advisorylock.Option{
			{advisorylock.WithKeepAlive(0), advisorylock.WithDeadHolderTimeout(0)},
			{advisorylock.WithKeepAlive(30 * time.Second), advisorylock.WithDeadHolderTimeout(40 * time.Second)},
			{advisorylock.WithReleaseTimeout(30 * time.Second)},
			{advisorylock.WithLeaseTTL(time.Second), advisorylock.WithPollInterval(time.Millisecond)},
		} {
			if err := mk(db, "valid-"+what, opts...); err != nil {
				t.Errorf("%s with valid options: %v", what, err)
			}
		}
	}
	if st := db.Stats(); st.OpenConnections != 0 {
		t.Fatalf("the constructors opened %d connections", st.OpenConnections)
	}
}

// TestConstructorsRefuseOptionsThatDoNotApply: an option that cannot
// change what a constructor makes is an error naming it, not ignored.
func TestConstructorsRefuseOptionsThatDoNotApply(t *testing.T) {
	db := neverDialled(t)
	cases := map[string][]advisorylock.Option{
		"NewSemaphore": {advisorylock.WithMinHold(time.Minute)},
		"NewElection":  {advisorylock.WithMinHold(time.Minute)},
		"NewLeaseLock": {advisorylock.WithKeepAlive(time.Second), advisorylock.WithDeadHolderTimeout(time.Minute), advisorylock.WithPoolerCheck(false)},
		"NewFence": {advisorylock.WithLeaseTTL(time.Minute), advisorylock.WithKeepAlive(time.Second), advisorylock.WithMinHold(time.Minute),
			advisorylock.WithOwner("me"), advisorylock.WithPollInterval(time.Second), advisorylock.WithClock(nil), advisorylock.WithObserver(nopObserver{})},
	}
	for what, opts := range cases {
		for _, opt := range opts {
			err := constructors[what](db, "n", opt)
			if err == nil || !strings.Contains(err.Error(), "does not apply") || !strings.Contains(err.Error(), "With") {
				t.Errorf("%s with an option that does not apply = %v, want an error naming the option", what, err)
			}
		}
	}
	// What every constructor takes.
	for what, mk := range constructors {
		if err := mk(db, "n", advisorylock.WithBackend(advisorylock.Postgres()), advisorylock.WithServerChecks(false), advisorylock.WithLogger(nil)); err != nil {
			t.Errorf("%s with WithBackend, WithServerChecks and WithLogger: %v", what, err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestDoRefusesANilFunctionWithoutTakingTheLock: every Do is given a nil
// fn by mistake; it returns an error naming the lock instead of
// panicking, and takes nothing.
func TestDoRefusesANilFunctionWithoutTakingTheLock(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	name := testdb.UniqueName(t)
	l := newLock(t, db, name)
	ll := newLeaseLock(t, db, name)
	s := newSemaphore(t, db, name, 2)
	calls := map[string]func() error{
		"Lock.Do":             func() error { return l.Do(ctx, nil) },
		"Lock.DoTimeout":      func() error { return l.DoTimeout(ctx, time.Second, nil) },
		"Lock.TryDo":          func() error { _, err := l.TryDo(ctx, nil); return err },
		"LeaseLock.Do":        func() error { return ll.Do(ctx, nil) },
		"LeaseLock.DoTimeout": func() error { return ll.DoTimeout(ctx, time.Second, nil) },
		"LeaseLock.TryDo":     func() error { _, err := ll.TryDo(ctx, nil); return err },
		"Semaphore.Do":        func() error { return s.Do(ctx, nil) },
		"Semaphore.TryDo":     func() error { _, err := s.TryDo(ctx, nil); return err },
	}
	for what, call := range calls {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "nil function") || !strings.Contains(err.Error(), name) {
			t.Errorf("%s(ctx, nil) = %v, want an error saying nil function and naming the lock", what, err)
		}
	}
	if n := locksHeld(t, db, name); n != 0 {
		t.Fatalf("%d advisory locks held after the refused calls, want 0", n)
	}
	if h, err := ll.Holder(ctx); err != nil || h != nil {
		t.Fatalf("lease Holder after the refused calls = %+v, %v; want free", h, err)
	}
}

// TestLockTimeoutErrorSaysTheBoundGiven: a zero or negative d is one
// attempt; the error says the d given, not a made-up wait.
func TestLockTimeoutErrorSaysTheBoundGiven(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	name := testdb.UniqueName(t)
	g := mustTry(t, newLock(t, db, name))
	defer mustRelease(t, g)
	other := newLock(t, testdb.OpenPostgres(t, "postgres"), name)
	for d, says := range map[time.Duration]string{-time.Second: "-1s", 0: "0s", 200 * time.Millisecond: "within 200ms"} {
		_, err := other.LockTimeout(ctx, d)
		if !errors.Is(err, advisorylock.ErrTimeout) || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), name) {
			t.Errorf("LockTimeout(%s) on a held lock = %v, want an error matching ErrTimeout saying %q and the name", d, err, says)
		}
	}
}
