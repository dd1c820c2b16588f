package advisorylocktest_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylocktest"
)

// These tests run the real library through every expectation of every
// backend: they are what keeps the expectations in step with the
// library's statements. A statement the library changes fails them.

// backends are the Mocks, and whether a Lock there holds a pinned
// connection (which a clean release puts back in the pool).
var backends = []struct {
	name    string
	expect  func(sqlmock.Sqlmock) *advisorylocktest.Mock
	session bool
}{
	{"postgres", advisorylocktest.Postgres, true},
	{"mysql", advisorylocktest.MySQL, true},
	{"sqlite", advisorylocktest.SQLite, false},
}

// mocked is a go-sqlmock handle and its Mock for one backend.
type mocked struct {
	db     *sql.DB
	mock   sqlmock.Sqlmock
	expect *advisorylocktest.Mock
}

func newMocked(t *testing.T, expect func(sqlmock.Sqlmock) *advisorylocktest.Mock) mocked {
	t.Helper()
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return mocked{db: db, mock: mock, expect: expect(mock)}
}

// lock returns a Lock on the mocked handle, made with the Mock's options
// and extra.
func (m mocked) lock(t *testing.T, name string, extra ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.New(m.db, name, append(m.expect.Options(), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (m mocked) lease(t *testing.T, name string) *advisorylock.LeaseLock {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(m.db, name, m.expect.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// met fails t unless every expectation was met, and, where a lock pins a
// connection, that connection went back to the pool (nothing was
// discarded).
func (m mocked) met(t *testing.T, pinned bool) {
	t.Helper()
	if err := m.mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
	if s := m.db.Stats(); pinned && (s.Idle != 1 || s.InUse != 0) {
		t.Fatalf("the connection was not put back in the pool: %+v", s)
	}
}

func eachBackend(t *testing.T, test func(t *testing.T, m mocked, session bool)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { test(t, newMocked(t, b.expect), b.session) })
	}
}

// Twice, so that the second try runs on a session the first has checked
// (PostgreSQL then sends a shorter statement).
func TestTryWinsAndReleaseTakeAndFreeTheLock(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "daily-digest")
		for range 2 {
			m.expect.ExpectTryWins()
			m.expect.ExpectRelease()
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatalf("TryLock on ExpectTryWins = %v", err)
			}
			if err := g.Release(context.Background()); err != nil {
				t.Fatalf("Release on ExpectRelease = %v", err)
			}
		}
		m.met(t, session)
	})
}

func TestTryLosesIsNotAcquired(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "daily-digest")
		m.expect.ExpectTryLoses()
		m.expect.ExpectTryLoses()
		if g, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock on ExpectTryLoses = %v, %v; want ErrNotAcquired", g, err)
		}
		ran, err := l.TryDo(context.Background(), func(context.Context) error {
			t.Error("TryDo ran its function on ExpectTryLoses")
			return nil
		})
		if ran || err != nil {
			t.Fatalf("TryDo on ExpectTryLoses = %v, %v; want false, nil", ran, err)
		}
		m.met(t, session)
	})
}

func TestTryDoRunsAndReleases(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "daily-digest")
		m.expect.ExpectTryWins()
		m.expect.ExpectRelease()
		runs := 0
		ran, err := l.TryDo(context.Background(), func(context.Context) error { runs++; return nil })
		if !ran || err != nil || runs != 1 {
			t.Fatalf("TryDo = %v, %v after %d runs; want true, nil after 1", ran, err, runs)
		}
		m.met(t, session)
	})
}

// Do on a free lock is a try that wins: Lock tries first.
func TestDoOnAFreeLockIsATryThatWins(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "migrations")
		m.expect.ExpectTryWins()
		m.expect.ExpectRelease()
		runs := 0
		if err := l.Do(context.Background(), func(context.Context) error { runs++; return nil }); err != nil || runs != 1 {
			t.Fatalf("Do = %v after %d runs; want nil after 1", err, runs)
		}
		m.met(t, session)
	})
}

func TestWaitGrantedLocks(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "migrations")
		m.expect.ExpectWaitGranted()
		m.expect.ExpectRelease()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := l.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock on ExpectWaitGranted = %v", err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
		m.expect.ExpectWaitGranted()
		m.expect.ExpectRelease()
		if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("Do on ExpectWaitGranted = %v", err)
		}
		m.met(t, session)
	})
}

// A wait that is not granted at once really waits: ExpectWaitGranted is
// not a try that wins.
func TestWaitGrantedIsNotATryThatWins(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		l := m.lock(t, "migrations")
		m.expect.ExpectWaitGranted()
		if g, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock on ExpectWaitGranted = %v, %v; want ErrNotAcquired (the wait is the second step)", g, err)
		}
		if err := m.mock.ExpectationsWereMet(); err == nil {
			t.Fatal("a TryLock met every expectation of a wait")
		}
	})
}

func TestReleaseNotHeldReturnsNil(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, session bool) {
		var logs lockedBuffer
		l := m.lock(t, "daily-digest", advisorylock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		m.expect.ExpectTryWins()
		m.expect.ExpectReleaseNotHeld()
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatalf("Release on ExpectReleaseNotHeld = %v", err)
		}
		if session && !strings.Contains(logs.String(), "not held") {
			t.Fatalf("a session lock released while not held logged %q, want a warning", logs.String())
		}
		m.met(t, session)
	})
}

func TestLeaseWinsCarriesTheToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, _ bool) {
		l := m.lease(t, "invoice-run")
		m.expect.ExpectLeaseWins(42)
		m.expect.ExpectLeaseRelease()
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatalf("LeaseLock.TryLock on ExpectLeaseWins = %v", err)
		}
		if g.Lease().Token() != 42 {
			t.Fatalf("token %d, want the 42 expected", g.Lease().Token())
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		m.expect.ExpectLeaseWins(43)
		m.expect.ExpectLeaseRelease()
		err = l.Do(context.Background(), func(_ context.Context, lease advisorylock.Lease) error {
			if lease.Token() != 43 {
				t.Errorf("Do's token %d, want 43", lease.Token())
			}
			return nil
		})
		if err != nil {
			t.Fatalf("LeaseLock.Do = %v", err)
		}
		m.met(t, false)
	})
}

func TestLeaseLosesIsNotAcquired(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, _ bool) {
		l := m.lease(t, "invoice-run")
		m.expect.ExpectLeaseLoses()
		m.expect.ExpectLeaseLoses()
		if g, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("LeaseLock.TryLock on ExpectLeaseLoses = %v, %v; want ErrNotAcquired", g, err)
		}
		ran, err := l.TryDo(context.Background(), func(context.Context, advisorylock.Lease) error {
			t.Error("TryDo ran its function on ExpectLeaseLoses")
			return nil
		})
		if ran || err != nil {
			t.Fatalf("LeaseLock.TryDo on ExpectLeaseLoses = %v, %v; want false, nil", ran, err)
		}
		m.met(t, false)
	})
}

func TestLeaseWinsRefusesTokenZero(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("ExpectLeaseWins(0) did not panic")
		}
	}()
	advisorylocktest.Postgres(nil).ExpectLeaseWins(0)
}

// names whose keys are negative and positive, and one that needs quoting
// in SQL text: For must match each as the library writes it.
var forNames = func() []string {
	names := []string{`it's a \ name`}
	var neg, pos bool
	for i := 0; !neg || !pos; i++ {
		name := "job-" + strconv.Itoa(i)
		switch k := advisorylock.Key(name); {
		case k < 0 && !neg:
			neg = true
			names = append(names, name)
		case k > 0 && !pos:
			pos = true
			names = append(names, name)
		}
	}
	return names
}()

func TestForMatchesItsLock(t *testing.T) {
	for _, name := range forNames {
		eachBackend(t, func(t *testing.T, m mocked, session bool) {
			e := m.expect.For(name)
			l := m.lock(t, name, advisorylock.WithLogger(slog.New(slog.DiscardHandler))) // not held: a warning
			e.ExpectTryWins()
			e.ExpectRelease()
			e.ExpectTryLoses()
			e.ExpectWaitGranted()
			e.ExpectReleaseNotHeld()
			mustTryAndRelease(t, l)
			if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
			}
			g, err := l.Lock(context.Background())
			if err != nil {
				t.Fatalf("Lock = %v", err)
			}
			if err := g.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			e.ExpectLeaseWins(7)
			e.ExpectLeaseRelease()
			lg, err := m.lease(t, name).TryLock(context.Background())
			if err != nil {
				t.Fatalf("LeaseLock.TryLock = %v", err)
			}
			if err := lg.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			m.met(t, session)
		})
	}
}

// For must not match another lock's statements, or it would say nothing.
func TestForDoesNotMatchAnotherLock(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, _ bool) {
		m.expect.For("daily-digest").ExpectTryWins()
		m.mock.ExpectClose() // the failed try discards its connection
		if g, err := m.lock(t, "weekly-digest").TryLock(context.Background()); err == nil {
			t.Fatalf("TryLock of another lock met For's expectation: %v", g)
		}
	})
	eachBackend(t, func(t *testing.T, m mocked, _ bool) {
		m.expect.For("daily-digest").ExpectLeaseWins(1)
		if g, err := m.lease(t, "weekly-digest").TryLock(context.Background()); err == nil {
			t.Fatalf("LeaseLock.TryLock of another lease met For's expectation: %v", g)
		}
	})
}

// Options name the backend and turn off what sqlmock cannot answer, and
// every constructor takes them.
func TestOptionsFitEveryConstructor(t *testing.T) {
	eachBackend(t, func(t *testing.T, m mocked, _ bool) {
		opts := m.expect.Options()
		if _, err := advisorylock.New(m.db, "x", opts...); err != nil {
			t.Error(err)
		}
		if _, err := advisorylock.NewLeaseLock(m.db, "x", opts...); err != nil {
			t.Error(err)
		}
		if _, err := advisorylock.NewSemaphore(m.db, "x", 2, opts...); err != nil {
			t.Error(err)
		}
		if _, err := advisorylock.NewElection(m.db, "x", opts...); err != nil {
			t.Error(err)
		}
		if _, err := advisorylock.NewFence(m.db, "x", opts...); err != nil {
			t.Error(err)
		}
	})
}

// Without the Options the library cannot tell sqlmock's driver: the
// Options are needed, not decoration.
func TestWithoutOptionsTheBackendIsUnknown(t *testing.T) {
	m := newMocked(t, advisorylocktest.Postgres)
	l, err := advisorylock.New(m.db, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("TryLock without the Mock's Options = %v, want ErrUnsupported", err)
	}
}

func mustTryAndRelease(t *testing.T, l *advisorylock.Lock) {
	t.Helper()
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock = %v", err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release = %v", err)
	}
}

// lockedBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Options that change the text of a Lock's statements (the dead-holder
// settings PostgreSQL sends with its try and wait, MySQL's wait_timeout)
// change nothing the expectations see.
func TestExpectationsHoldUnderStatementOptions(t *testing.T) {
	for _, opts := range [][]advisorylock.Option{
		{advisorylock.WithDeadHolderTimeout(0)},
		{advisorylock.WithDeadHolderTimeout(time.Minute)},
		{advisorylock.WithKeepAlive(0)},
	} {
		eachBackend(t, func(t *testing.T, m mocked, session bool) {
			l := m.lock(t, "migrations", opts...)
			m.expect.ExpectTryWins()
			m.expect.ExpectRelease()
			m.expect.ExpectWaitGranted()
			m.expect.ExpectRelease()
			mustTryAndRelease(t, l)
			if err := l.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
				t.Fatalf("Do = %v", err)
			}
			m.met(t, session)
		})
	}
}
