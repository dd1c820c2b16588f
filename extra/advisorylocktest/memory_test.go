package advisorylocktest_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/extra/advisorylocktest"
)

// These tests run the real library on a Memory: New, NewLeaseLock, the
// acquires, waits, renewals and releases are the library's own.

// openMemoryDB returns a handle for locks on mem, closed at cleanup.
func openMemoryDB(t *testing.T, mem *advisorylocktest.Memory) *sql.DB {
	t.Helper()
	db := mem.OpenDB()
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// quiet is a logger for tests whose locks are lost on purpose.
var quiet = advisorylock.WithLogger(slog.New(slog.DiscardHandler))

func memLock(t *testing.T, mem *advisorylocktest.Memory, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.New(openMemoryDB(t, mem), name, append(mem.Options(), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func memLease(t *testing.T, mem *advisorylocktest.Memory, name string, opts ...advisorylock.Option) *advisorylock.LeaseLock {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(openMemoryDB(t, mem), name, append(mem.Options(), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func release(t *testing.T, g interface{ Release(context.Context) error }) {
	t.Helper()
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release = %v", err)
	}
}

// waitLost fails t unless lost closes within a few renewals.
func waitLost(t *testing.T, lost <-chan struct{}) {
	t.Helper()
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not close")
	}
}

// testClock is a clock that moves only when told (WithClock takes its Now).
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Two Locks of one name on one Memory, through two handles, exclude each
// other as two processes on one database do; a release lets the other in.
func TestMemoryLocksExcludeEachOther(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	a, b := memLock(t, mem, "daily-digest"), memLock(t, mem, "daily-digest")
	ga, err := a.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g, err := b.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock while held = %v, %v; want ErrNotAcquired", g, err)
	}
	if h, err := b.Holder(context.Background()); err != nil || h == nil || h.Name != "daily-digest" || h.Owner == "" {
		t.Fatalf("Holder while held = %+v, %v; want the memory's holder of daily-digest, with its owner", h, err)
	}
	release(t, ga)
	gb, err := b.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after the release = %v", err)
	}
	release(t, gb)
}

func TestMemoriesAreSeparate(t *testing.T) {
	a := memLock(t, advisorylocktest.NewMemory(), "x")
	b := memLock(t, advisorylocktest.NewMemory(), "x")
	ga, err := a.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, ga)
	gb, err := b.TryLock(context.Background())
	if err != nil {
		t.Fatalf("a lock on another Memory = %v, want it free", err)
	}
	release(t, gb)
}

func TestMemoryLockWaitsForTheRelease(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	a, b := memLock(t, mem, "migrations"), memLock(t, mem, "migrations")
	ga, err := a.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gb, err := b.Lock(ctx)
		if err == nil {
			err = gb.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v while the lock was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	release(t, ga)
	if err := <-got; err != nil {
		t.Fatalf("Lock after the release = %v", err)
	}
}

func TestMemoryLockGivesUpWithItsContext(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	ga, err := memLock(t, mem, "migrations").TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, ga)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if g, err := memLock(t, mem, "migrations").Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a held lock = %v, %v; want the context's deadline", g, err)
	}
	if g, err := memLock(t, mem, "migrations").LockTimeout(context.Background(), 50*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout on a held lock = %v, %v; want ErrTimeout", g, err)
	}
}

// A holder that stops renewing (its clock jumped past its TTL, as a
// paused process's does) loses the lease: the row expires, the next
// acquire gets it with a higher token, and the old Guard reports the loss.
func TestMemoryExpiredLeaseIsFreed(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	clock := newTestClock()
	opts := []advisorylock.Option{advisorylock.WithClock(clock.Now), advisorylock.WithLeaseTTL(time.Second), quiet}
	old, err := memLease(t, mem, "invoice-run", opts...).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	next := memLease(t, mem, "invoice-run", opts...)
	if _, err := next.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock while the lease is live = %v, want ErrNotAcquired", err)
	}
	clock.Advance(2 * time.Second)
	g, err := next.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after the TTL = %v, want the expired lease", err)
	}
	if g.Lease().Token() <= old.Lease().Token() {
		t.Fatalf("token %d after an expiry, want more than %d", g.Lease().Token(), old.Lease().Token())
	}
	waitLost(t, old.Lease().Lost())
	release(t, old)
	release(t, g)
}

// A Lock's row expires too: a Lock is a lease row on a Memory.
func TestMemoryExpiredLockIsFreed(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	clock := newTestClock()
	opts := []advisorylock.Option{advisorylock.WithClock(clock.Now), advisorylock.WithLeaseTTL(time.Second), quiet}
	old, err := memLock(t, mem, "x", opts...).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	g, err := memLock(t, mem, "x", opts...).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after the TTL = %v, want the expired lock", err)
	}
	waitLost(t, old.Lost())
	release(t, old)
	release(t, g)
}

func TestMemoryTokensIncrease(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	l := memLease(t, mem, "invoice-run")
	var last advisorylock.FencingToken
	for range 5 {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if g.Lease().Token() <= last {
			t.Fatalf("token %d after %d, want it higher", g.Lease().Token(), last)
		}
		last = g.Lease().Token()
		release(t, g)
	}
}

// Renewals keep a lease held past its TTL, on the library's schedule.
func TestMemoryRenewalKeepsTheLease(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	l := memLease(t, mem, "invoice-run", advisorylock.WithLeaseTTL(time.Second))
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, g)
	time.Sleep(1500 * time.Millisecond)
	select {
	case <-g.Lease().Lost():
		t.Fatal("a renewed lease was lost")
	default:
	}
	if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock past the first TTL = %v, want ErrNotAcquired (renewed)", err)
	}
}

func TestMemoryRevokeLosesTheHold(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	l := memLock(t, mem, "x", advisorylock.WithLeaseTTL(time.Second), quiet)
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mem.Revoke("x")
	waitLost(t, g.Lost())
	release(t, g)
	mustTryAndRelease(t, memLock(t, mem, "x"))
}

// Revoke frees the name at once, but its holder learns of it only at its
// next renewal (a third of the TTL, 10 s by default): meanwhile another
// lock on the same Memory takes the name while the first Guard's Lost is
// still open, as after an operator deleted the row of a database.
func TestMemoryRevokeFreesTheNameBeforeTheHolderKnows(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	g, err := memLock(t, mem, "x", quiet).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(context.Background()) }()
	mem.Revoke("x")
	other, err := memLock(t, mem, "x").TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after Revoke = %v, want the name free at once", err)
	}
	defer release(t, other)
	select {
	case <-g.Lost():
		t.Fatal("the revoked holder was told before its renewal: update the README's Revoke paragraph")
	default:
	}
}

func TestMemorySharedHolders(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	l := memLock(t, mem, "catalog")
	r1, err := l.TryRLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := memLock(t, mem, "catalog").TryRLock(context.Background())
	if err != nil {
		t.Fatalf("a second shared hold = %v, want it beside the first", err)
	}
	if hs, err := l.Holders(context.Background()); err != nil || len(hs) != 2 || !hs[0].Shared {
		t.Fatalf("Holders = %v, %v; want the two shared holders", hs, err)
	}
	if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock with shared holders in = %v, want ErrNotAcquired", err)
	}
	release(t, r1)
	release(t, r2)
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after the shared holders left = %v", err)
	}
	if _, err := l.TryRLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryRLock with an exclusive holder = %v, want ErrNotAcquired", err)
	}
	release(t, g)
}

// A waiting writer keeps new shared holders out, and is let in when the
// shared holders leave.
func TestMemoryWaitingWriterIsNotStarved(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	l := memLock(t, mem, "catalog")
	r, err := l.TryRLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	writer := memLock(t, mem, "catalog")
	got := make(chan error, 1)
	go func() {
		g, err := writer.LockTimeout(context.Background(), 10*time.Second)
		if err == nil {
			err = g.Release(context.Background())
		}
		got <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		g, err := l.TryRLock(context.Background())
		if errors.Is(err, advisorylock.ErrNotAcquired) {
			break // the writer's claim keeps new shared holders out
		}
		if err != nil {
			t.Fatal(err)
		}
		release(t, g) // in before the writer's first try
		if time.Now().After(deadline) {
			t.Fatal("a waiting writer never kept new shared holders out")
		}
	}
	release(t, r)
	if err := <-got; err != nil {
		t.Fatalf("the waiting writer = %v", err)
	}
}

// WithMinHold keeps the name taken for the window after each grant, also
// after the release: a job that every replica fires runs once per window.
func TestMemoryMinHoldKeepsTheWindow(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	clock := newTestClock()
	opts := []advisorylock.Option{advisorylock.WithClock(clock.Now), advisorylock.WithMinHold(time.Minute)}
	for _, kind := range []string{"lock", "lease"} {
		t.Run(kind, func(t *testing.T) {
			runs := 0
			tryDo := func() bool {
				t.Helper()
				var ran bool
				var err error
				if kind == "lock" {
					ran, err = memLock(t, mem, "hourly-"+kind, opts...).TryDo(context.Background(), func(context.Context) error { runs++; return nil })
				} else {
					ran, err = memLease(t, mem, "hourly-"+kind, opts...).TryDo(context.Background(), func(context.Context, advisorylock.Lease) error { runs++; return nil })
				}
				if err != nil {
					t.Fatal(err)
				}
				return ran
			}
			if !tryDo() {
				t.Fatal("the first TryDo did not run")
			}
			clock.Advance(30 * time.Second)
			if tryDo() {
				t.Fatal("a TryDo inside the window ran")
			}
			clock.Advance(31 * time.Second)
			if !tryDo() || runs != 2 {
				t.Fatalf("after the window: %d runs, want 2", runs)
			}
		})
	}
}

// TestMemoryTryDoOnceRunsEachRunOnce: a run recorded done is not run
// again, by any Lock on the Memory; a run that failed is; records older
// than the retention go as others are recorded.
func TestMemoryTryDoOnceRunsEachRunOnce(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	clock := newTestClock()
	ctx := context.Background()
	runs := 0
	once := func(run string, fail bool) bool {
		t.Helper()
		ran, err := memLock(t, mem, "daily", advisorylock.WithClock(clock.Now), advisorylock.WithRunRetention(time.Hour)).TryDoOnce(ctx, run, func(context.Context) error {
			runs++
			if fail {
				return errors.New("failed")
			}
			return nil
		})
		if err != nil && !fail {
			t.Fatal(err)
		}
		return ran
	}
	once("a", true)
	if !once("a", false) || runs != 2 {
		t.Fatalf("a run whose first try failed: %d runs, want 2", runs)
	}
	if once("a", false) || runs != 2 {
		t.Fatalf("a run recorded done ran again: %d runs", runs)
	}
	clock.Advance(2 * time.Hour)
	if !once("b", false) || runs != 3 {
		t.Fatalf("another run: %d runs, want 3", runs)
	}
	if !once("a", false) || runs != 4 {
		t.Fatalf("a run whose record passed the retention: %d runs, want it run again", runs)
	}
}

func TestMemoryFenceRefusesAStaleToken(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	db := openMemoryDB(t, mem)
	fence, err := advisorylock.NewFence(db, "invoices", mem.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	admit := func(token advisorylock.FencingToken) error {
		tx, err := db.BeginTx(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := fence.Admit(context.Background(), tx, token); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := admit(2); err != nil {
		t.Fatal(err)
	}
	if err := admit(2); err != nil {
		t.Fatalf("admitting the same token again = %v, want nil", err)
	}
	if err := admit(1); !errors.Is(err, advisorylock.ErrStaleToken) || !strings.Contains(err.Error(), "highest admitted 2") {
		t.Fatalf("admitting a lower token = %v, want ErrStaleToken naming 2", err)
	}
}

func TestMemoryHandleRunsNoStatements(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	db := openMemoryDB(t, mem)
	if _, err := db.ExecContext(context.Background(), "SELECT 1"); !errors.Is(err, advisorylocktest.ErrNoStatements) {
		t.Fatalf("Exec on the Memory's handle = %v, want ErrNoStatements", err)
	}
	l, err := advisorylock.New(db, "x") // forgot mem.Options()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("TryLock without the Memory's Options = %v, want ErrUnsupported (no backend)", err)
	}
}

// A Semaphore's slots are Locks: on a Memory, N holders and no more.
func TestMemorySemaphoreAdmitsItsSlots(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	s, err := advisorylock.NewSemaphore(openMemoryDB(t, mem), "workers", 2, mem.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("a third holder of two slots = %v, want ErrNotAcquired", err)
	}
	release(t, a)
	release(t, b)
}

// The store's own promises, called as the library calls them: a renewal
// or a release by anyone but the holder changes nothing.
func TestMemoryOnlyTheHolderRenewsAndReleases(t *testing.T) {
	ctx := context.Background()
	start := newTestClock().Now()
	for _, kind := range []string{"lock", "shared", "lease"} {
		mem := advisorylocktest.NewMemory()
		req := backend.LeaseRequest{Kind: kind, Name: "x", Key: advisorylock.Key("x"), Owner: "a/1", TTL: time.Minute, Now: start}
		token, err := mem.AcquireLease(ctx, nil, req)
		if err != nil {
			t.Fatal(err)
		}
		req.Token = token
		other := req
		other.Owner, other.Token = "b/2", token+1
		if _, err := mem.RenewLease(ctx, nil, other); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("kind %s: a renewal by another owner = %v, want backend.ErrLeaseLost", kind, err)
		}
		if err := mem.ReleaseLease(ctx, nil, other); err != nil {
			t.Fatal(err)
		}
		if h, err := holderOf(mem, req); err != nil || h == nil || h.Owner != "a/1" {
			t.Errorf("kind %s: after another owner's release, holder %+v, %v; want a/1", kind, h, err)
		}
		late := req
		late.Now = start.Add(2 * time.Minute)
		if _, err := mem.RenewLease(ctx, nil, late); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("kind %s: a renewal after the TTL = %v, want backend.ErrLeaseLost", kind, err)
		}
		if _, err := mem.RenewLease(ctx, nil, req); err != nil {
			t.Errorf("kind %s: the holder's renewal = %v", kind, err)
		}
	}
}

// holderOf reads r's holder as the library would for r's kind: a lease's
// holder, or the first of a key's holders.
func holderOf(mem *advisorylocktest.Memory, r backend.LeaseRequest) (*backend.Holder, error) {
	if r.Kind == "lease" {
		return mem.LeaseHolder(context.Background(), nil, r)
	}
	hs, err := mem.LeaseHolders(context.Background(), nil, r)
	if len(hs) == 0 {
		return nil, err
	}
	return hs[0], err
}

// An Election on a Memory leads with its lease's token as the term.
func TestMemoryElectionLeadsWithATerm(t *testing.T) {
	mem := advisorylocktest.NewMemory()
	e, err := advisorylock.NewElection(openMemoryDB(t, mem), "leader", mem.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var term advisorylock.FencingToken
	err = e.Run(ctx, func(ctx context.Context, t advisorylock.FencingToken) error {
		term = t
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || term == 0 {
		t.Fatalf("Run = %v with term %d; want context.Canceled after leading with a term", err, term)
	}
}
