package advisorylock_test

// The plug-in contract: a backend of a third party's making gets every
// capability the built-in ones have, through the exported interfaces of
// package backend alone.

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// party is a backend as a third party writes one: a type of its own that
// implements every optional interface of package backend by forwarding to
// a built-in backend through those same interfaces only (it cannot see
// the built-in's unexported methods), answering ErrUnsupported where the
// built-in lacks one, and counting the calls of each interface (and,
// where an interface has several jobs, of each job).
type party struct {
	inner backend.Backend
	calls *calls
}

// The interfaces a party implements, checked by the compiler.
var _ interface {
	backend.SessionLocker
	backend.LeaseStore
	backend.Validator
	backend.Configurer
	backend.SessionIdentifier
	backend.TermKeeper
	backend.TxLocker
	backend.SharedSessionLocker
	backend.SlotLocker
	backend.SetLocker
	backend.MultiplexLocker
	backend.ReleaseSignaler
	backend.TableChecker
	backend.TokenAdmitter
	backend.RunRecorder
	backend.SharedRowStore
	backend.ReleaseListener
	backend.LeaseSleeper
} = party{}

// innerAs returns p's built-in backend as T, counting a call of iface;
// false where the built-in is no T (the party then answers
// ErrUnsupported, as a backend may where its driver lacks a capability).
func innerAs[T any](p party, iface string) (T, bool) {
	p.calls.add(iface)
	t, ok := p.inner.(T)
	return t, ok
}

// wrap returns b as a party, counting into p's calls.
func (p party) wrap(b backend.Backend) backend.SessionLocker {
	return party{inner: b, calls: p.calls}
}

// calls counts the calls of each optional interface, by its name, and
// keeps every pair of settings that Configure was given.
type calls struct {
	mu       sync.Mutex
	n        map[string]int
	settings []settings
}

// settings are Configure's arguments for a Lock's sessions.
type settings struct {
	deadHolder   time.Duration
	serverChecks bool
}

func (c *calls) configure(s settings) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settings = append(c.settings, s)
}

// gave reports whether Configure was given s.
func (c *calls) gave(s settings) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.settings, s)
}

func (c *calls) add(iface string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[iface]++
}

func (p party) heldKeysCalls() int { return p.calls.count("MultiplexLocker") }

func (c *calls) count(iface string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[iface]
}

func (p party) session() backend.SessionLocker { return p.inner.(backend.SessionLocker) }
func (p party) store() backend.LeaseStore      { return p.inner.(backend.LeaseStore) }

// Backend, SessionLocker and LeaseStore: the required methods.
func (p party) Name() string { return "party-" + p.inner.Name() }
func (p party) Traits() backend.Traits {
	p.calls.add("Traits")
	return p.inner.Traits()
}
func (p party) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	return p.session().TryLockSession(ctx, conn, key)
}
func (p party) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (backend.SessionResult, error) {
	return p.session().WaitLockSession(ctx, conn, key, slice)
}
func (p party) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	return p.session().UnlockSession(ctx, conn, key)
}
func (p party) HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	return p.session().HoldsSession(ctx, conn, key)
}
func (p party) SessionHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	return p.session().SessionHolder(ctx, db, key)
}
func (p party) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	p.calls.add("LeaseStore.AcquireLease")
	return p.store().AcquireLease(ctx, db, r)
}
func (p party) RenewLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	return p.store().RenewLease(ctx, db, r)
}
func (p party) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	return p.store().ReleaseLease(ctx, db, r)
}
func (p party) LeaseHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	return p.store().LeaseHolder(ctx, db, r)
}
func (p party) Schema() string { return p.store().Schema() }

// Validator
func (p party) Validate(ctx context.Context, db backend.DB) error {
	if v, ok := innerAs[backend.Validator](p, "Validator"); ok {
		return v.Validate(ctx, db)
	}
	return nil
}

// Configurer
func (p party) Configure(db backend.DB, deadHolder time.Duration, serverChecks bool) backend.Backend {
	c, _ := innerAs[backend.Configurer](p, "Configurer")
	p.calls.configure(settings{deadHolder, serverChecks})
	return p.wrap(c.Configure(db, deadHolder, serverChecks))
}

// SessionIdentifier: the pooler probe.
func (p party) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	if s, ok := innerAs[backend.SessionIdentifier](p, "SessionIdentifier"); ok {
		return s.SessionIdentity(ctx, conn)
	}
	return "", backend.ErrUnsupported
}

// TermKeeper: an Election's terms.
func (p party) PrepareElections(ctx context.Context, db backend.DB) error {
	if k, ok := innerAs[backend.TermKeeper](p, "TermKeeper.PrepareElections"); ok {
		return k.PrepareElections(ctx, db)
	}
	return backend.ErrUnsupported
}
func (p party) BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (uint64, error) {
	if k, ok := innerAs[backend.TermKeeper](p, "TermKeeper.BeginTerm"); ok {
		return k.BeginTerm(ctx, conn, key, name, owner)
	}
	return 0, backend.ErrUnsupported
}
func (p party) TermHolder(ctx context.Context, db backend.DB, key int64, name string) (*backend.Holder, error) {
	if k, ok := innerAs[backend.TermKeeper](p, "TermKeeper.TermHolder"); ok {
		return k.TermHolder(ctx, db, key, name)
	}
	return nil, backend.ErrUnsupported
}
func (p party) EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error {
	if k, ok := innerAs[backend.TermKeeper](p, "TermKeeper.EndTerm"); ok {
		return k.EndTerm(ctx, conn, name, term)
	}
	return backend.ErrUnsupported
}

// TxLocker: transaction locks (none over MySQL).
func (p party) TryLockTx(ctx context.Context, tx *sql.Tx, key int64) (bool, error) {
	if l, ok := innerAs[backend.TxLocker](p, "TxLocker.TryLockTx"); ok {
		return l.TryLockTx(ctx, tx, key)
	}
	return false, backend.ErrUnsupported
}
func (p party) TxSettings(ctx context.Context, tx *sql.Tx) (map[string]string, error) {
	if l, ok := innerAs[backend.TxLocker](p, "TxLocker.WaitLockTx"); ok {
		return l.TxSettings(ctx, tx)
	}
	return nil, backend.ErrUnsupported
}
func (p party) WaitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev map[string]string) (bool, error) {
	if l, ok := innerAs[backend.TxLocker](p, "TxLocker.WaitLockTx"); ok {
		return l.WaitLockTx(ctx, tx, key, slice, prev)
	}
	return false, backend.ErrUnsupported
}

// SharedSessionLocker
func (p party) Shared() backend.SessionLocker {
	s, _ := innerAs[backend.SharedSessionLocker](p, "SharedSessionLocker")
	return p.wrap(s.Shared())
}
func (p party) SessionHolders(ctx context.Context, db backend.DB, key int64) ([]*backend.Holder, error) {
	s, _ := innerAs[backend.SharedSessionLocker](p, "SharedSessionLocker")
	return s.SessionHolders(ctx, db, key)
}
func (p party) EndWait(ctx context.Context, conn *sql.Conn, key int64) error {
	s, _ := innerAs[backend.SharedSessionLocker](p, "SharedSessionLocker.EndWait")
	return s.EndWait(ctx, conn, key)
}

// SlotLocker: a semaphore's slots.
func (p party) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	if l, ok := innerAs[backend.SlotLocker](p, "SlotLocker"); ok {
		return l.TryLockAny(ctx, conn, keys)
	}
	return 0, backend.SessionResult{}, backend.ErrUnsupported
}
func (p party) KeyHolders(ctx context.Context, db backend.DB, keys []int64) ([]*backend.Holder, error) {
	if l, ok := innerAs[backend.SlotLocker](p, "SlotLocker"); ok {
		return l.KeyHolders(ctx, db, keys)
	}
	return nil, backend.ErrUnsupported
}

// SetLocker: a set's keys (one statement each over MySQL).
func (p party) TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	if l, ok := innerAs[backend.SetLocker](p, "SetLocker"); ok {
		return l.TryLockAll(ctx, conn, keys)
	}
	return backend.SessionResult{}, backend.ErrUnsupported
}
func (p party) UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	if l, ok := innerAs[backend.SetLocker](p, "SetLocker"); ok {
		return l.UnlockAll(ctx, conn, keys)
	}
	return backend.SessionResult{}, backend.ErrUnsupported
}

// MultiplexLocker: multiplexed locks' keep-alive.
func (p party) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	l, _ := innerAs[backend.MultiplexLocker](p, "MultiplexLocker")
	return l.HeldKeys(ctx, conn, keys)
}

// ReleaseSignaler: a semaphore's slot release (a plain release over
// MySQL).
func (p party) UnlockAndSignal(ctx context.Context, conn *sql.Conn, key, signal int64) (backend.SessionResult, error) {
	if s, ok := innerAs[backend.ReleaseSignaler](p, "ReleaseSignaler"); ok {
		return s.UnlockAndSignal(ctx, conn, key, signal)
	}
	return backend.SessionResult{}, backend.ErrUnsupported
}

// TableChecker: the tables of the session backend's terms and windows
// are checked through it too.
func (p party) CheckTables(ctx context.Context, db backend.DB, tables ...string) error {
	if c, ok := innerAs[backend.TableChecker](p, "TableChecker"); ok {
		return c.CheckTables(ctx, db, tables...)
	}
	return nil
}

// TokenAdmitter: a Fence.
func (p party) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (uint64, error) {
	if a, ok := innerAs[backend.TokenAdmitter](p, "TokenAdmitter"); ok {
		return a.AdmitToken(ctx, tx, resource, token)
	}
	return 0, backend.ErrUnsupported
}

// RunRecorder: TryDoOnce's records of runs.
func (p party) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	if r, ok := innerAs[backend.RunRecorder](p, "RunRecorder.RunDone"); ok {
		return r.RunDone(ctx, db, name, run)
	}
	return false, backend.ErrUnsupported
}
func (p party) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	if r, ok := innerAs[backend.RunRecorder](p, "RunRecorder.RecordRun"); ok {
		return r.RecordRun(ctx, db, name, run, now, keep)
	}
	return backend.ErrUnsupported
}

// SharedRowStore: never used over a session backend (its Locks are
// session locks).
func (p party) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	if s, ok := innerAs[backend.SharedRowStore](p, "SharedRowStore"); ok {
		return s.LeaseHolders(ctx, db, r)
	}
	return nil, backend.ErrUnsupported
}

// ReleaseListener, LeaseQueuer and LeaseSleeper: a LeaseLock waiter's
// place in line, the listener that tells it a release handed it the
// lease, and its sleep in line where releases are not heard.
func (p party) ListenReleases(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64)) error {
	if l, ok := innerAs[backend.ReleaseListener](p, "ReleaseListener"); ok {
		return l.ListenReleases(ctx, db, conn, ready, released)
	}
	return backend.ErrUnsupported
}
func (p party) QueueLease(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest) (uint64, error) {
	defer p.calls.add("LeaseQueuer.QueueLease returned")
	if q, ok := innerAs[backend.LeaseQueuer](p, "LeaseQueuer.QueueLease"); ok {
		return q.QueueLease(ctx, db, conn, r)
	}
	return 0, backend.ErrUnsupported
}
func (p party) ListenGrants(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error {
	if q, ok := innerAs[backend.LeaseQueuer](p, "LeaseQueuer.ListenGrants"); ok {
		return q.ListenGrants(ctx, db, conn, ready, released)
	}
	return backend.ErrUnsupported
}
func (p party) SleepInLine(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest, d time.Duration) (bool, error) {
	if s, ok := innerAs[backend.LeaseSleeper](p, "LeaseSleeper"); ok {
		return s.SleepInLine(ctx, db, conn, r, d)
	}
	return false, backend.ErrUnsupported
}

// partyOps runs, through a third party's backend, an operation of each
// kind that looks for an optional interface, and checks that each did
// its work: exclusion against the built-in backend on the same name, a
// semaphore's slot, a shared hold, a term that ends on resign, a run
// recorded done.
func partyOps(t *testing.T, db *sql.DB, b backend.Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	opts := []advisorylock.Option{advisorylock.WithBackend(b), advisorylock.WithKeepAlive(time.Second), advisorylock.WithDeadHolderTimeout(10 * time.Second)}

	name := testdb.UniqueName(t)
	l := newLock(t, db, name, opts...)
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check through %s: %v", b.Name(), err)
	}
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock through %s: %v", b.Name(), err)
	}
	if _, err := newLock(t, db, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("the built-in backend's TryLock beside %s's hold = %v, want ErrNotAcquired", b.Name(), err)
	}
	mustRelease(t, g)

	s := newSemaphore(t, db, testdb.UniqueName(t), 3, advisorylock.WithBackend(b))
	sg, err := s.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("Semaphore.TryAcquire through %s: %v", b.Name(), err)
	}
	if hs, err := s.Holders(ctx); err != nil || len(hs) != 1 {
		t.Fatalf("Semaphore.Holders through %s = %v, %v; want one holder", b.Name(), hs, err)
	}
	mustRelease(t, sg)

	shared := newLock(t, db, testdb.UniqueName(t), advisorylock.WithBackend(b))
	r1, err := shared.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock through %s: %v", b.Name(), err)
	}
	r2, err := shared.TryRLock(ctx)
	if err != nil {
		t.Fatalf("a second TryRLock through %s: %v", b.Name(), err)
	}
	if hs, err := shared.Holders(ctx); err != nil || len(hs) != 2 {
		t.Fatalf("Holders of two shared holds through %s = %v, %v", b.Name(), hs, err)
	}
	mustRelease(t, r1)
	mustRelease(t, r2)

	// Many locks on one shared session, checked by one keep-alive
	// statement; a set of two names (one statement where the backend's
	// TryLockAll can, else one per key), excluding the built-in backend
	// from each.
	muxed := []advisorylock.Option{advisorylock.WithBackend(b), advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(20 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second), advisorylock.WithDeadHolderTimeout(10 * time.Second)}
	m1, err := newLock(t, db, testdb.UniqueName(t), muxed...).TryLock(ctx)
	if err != nil {
		t.Fatalf("multiplexed TryLock through %s: %v", b.Name(), err)
	}
	m2, err := newLock(t, db, testdb.UniqueName(t), muxed...).TryLock(ctx)
	if err != nil {
		t.Fatalf("a second multiplexed TryLock through %s: %v", b.Name(), err)
	}
	if c, ok := b.(interface{ heldKeysCalls() int }); ok {
		testdb.WaitFor(t, wait, func() bool { return c.heldKeysCalls() > 0 }, "the shared session's keep-alive never asked the third party's HeldKeys")
	}
	mustRelease(t, m1)
	mustRelease(t, m2)
	setNames := []string{testdb.UniqueName(t) + "/a", testdb.UniqueName(t) + "/b"}
	set, err := advisorylock.NewSet(db, setNames, advisorylock.WithBackend(b))
	if err != nil {
		t.Fatal(err)
	}
	setG, err := set.TryLock(ctx)
	if err != nil {
		t.Fatalf("a set's TryLock through %s: %v", b.Name(), err)
	}
	if _, err := newLock(t, db, setNames[1]).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("the built-in backend's TryLock beside %s's set = %v, want ErrNotAcquired", b.Name(), err)
	}
	mustRelease(t, setG)

	e := newElection(t, db, testdb.UniqueName(t), advisorylock.WithBackend(b))
	if err := e.Check(ctx); err != nil {
		t.Fatalf("Election.Check through %s: %v", b.Name(), err)
	}
	stop := errors.New("stop")
	if err := e.Run(ctx, func(context.Context, advisorylock.FencingToken) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("Election.Run through %s = %v, want the lead's error", b.Name(), err)
	}

	// A run recorded done through the third party's store, seen done by
	// the built-in backend.
	once := testdb.UniqueName(t)
	runs := 0
	count := func(context.Context) error { runs++; return nil }
	if ran, err := newLock(t, db, once, advisorylock.WithBackend(b)).TryDoOnce(ctx, "r", count); !ran || err != nil {
		t.Fatalf("TryDoOnce through %s = %v, %v; want it run", b.Name(), ran, err)
	}
	if ran, err := newLock(t, db, once).TryDoOnce(ctx, "r", count); ran || err != nil || runs != 1 {
		t.Fatalf("the built-in backend's TryDoOnce after %s's = %v, %v (%d runs); want the run seen done", b.Name(), ran, err, runs)
	}
}

// wantCalls fails the test for each interface in ifaces that c saw no
// call of.
func wantCalls(t *testing.T, c *calls, ifaces ...string) {
	t.Helper()
	for _, iface := range ifaces {
		if c.count(iface) == 0 {
			t.Errorf("the library never called the third party's %s", iface)
		}
	}
}

// TestAThirdPartysBackendGetsEveryCapability: a backend that reaches the
// built-in PostgreSQL backend only through the exported interfaces locks,
// excludes, tunes itself per driver, configures its sessions, takes a
// semaphore's slots in one statement, shared holds, transaction locks
// (waiting for one too), checks its tables, ends its terms, records runs
// and listens for a LeaseLock waiter: every optional interface is called.
func TestAThirdPartysBackendGetsEveryCapability(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			c := &calls{n: map[string]int{}}
			b := party{inner: advisorylock.Postgres(), calls: c}
			partyOps(t, db, b)

			// A transaction lock, held elsewhere, then waited for.
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			name := testdb.UniqueName(t)
			holder, err := newLock(t, db, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			done := make(chan error, 1)
			go func() { done <- newLock(t, db, name, advisorylock.WithBackend(b)).LockTx(ctx, tx) }()
			testdb.WaitFor(t, wait, func() bool { return c.count("TxLocker.WaitLockTx") > 0 }, "LockTx never waited through the third party's WaitLockTx")
			mustRelease(t, holder)
			if err := <-done; err != nil {
				t.Fatalf("LockTx through the third party: %v", err)
			}

			// A LeaseLock waiter, whose listener listens through the third
			// party (the store signals releases); on lib/pq, which delivers
			// no notifications, it sleeps in line through it.
			lname := testdb.UniqueName(t)
			lg, err := newLeaseLock(t, db, lname, advisorylock.WithBackend(b)).TryLock(ctx)
			if err != nil {
				t.Fatalf("LeaseLock.TryLock through the third party: %v", err)
			}
			lwaiter := newLeaseLock(t, db, lname, advisorylock.WithBackend(b))
			lgot := make(chan error, 1)
			go func() {
				wg, err := lwaiter.Lock(ctx)
				if err == nil {
					err = wg.Release(context.Background())
				}
				lgot <- err
			}()
			testdb.WaitFor(t, wait, func() bool { return c.count("LeaseQueuer.ListenGrants") > 0 && c.count("LeaseQueuer.QueueLease") > 0 },
				"a LeaseLock waiter never listened through the third party's ListenGrants, or never queued through its QueueLease")
			lease := []string{"LeaseQueuer.QueueLease", "LeaseQueuer.ListenGrants"}
			if drv == "postgres" {
				testdb.WaitFor(t, wait, func() bool { return c.count("LeaseSleeper") > 0 },
					"a LeaseLock waiter on lib/pq never slept in line through the third party's SleepInLine")
				lease = append(lease, "LeaseSleeper")
			}
			if err := lg.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-lgot; err != nil {
				t.Fatalf("LeaseLock.Lock through the third party: %v", err)
			}

			wantCalls(t, c, "Validator", "Configurer", "Traits", "SessionIdentifier", "SlotLocker", "MultiplexLocker", "SetLocker", "ReleaseSignaler", "SharedSessionLocker", "TxLocker.TryLockTx", "TxLocker.WaitLockTx", "TermKeeper.PrepareElections", "TermKeeper.BeginTerm", "TermKeeper.EndTerm", "TableChecker", "RunRecorder.RunDone", "RunRecorder.RecordRun")
			wantCalls(t, c, lease...)
			if want := (settings{serverChecks: true}); !c.gave(want) {
				t.Errorf("Configure was given %+v, never %+v (the handle, before any Lock's settings)", c.settings, want)
			}
			if want := (settings{deadHolder: 10 * time.Second, serverChecks: true}); !c.gave(want) {
				t.Errorf("Configure was given %+v, never %+v (the Lock's WithDeadHolderTimeout, server checks on)", c.settings, want)
			}
		})
	}
}

// TestAThirdPartysMySQLBackendGetsEveryCapability: the same over the
// built-in MySQL backend, whose sessions end when idle (the dead-holder
// setting is passed only with a keep-alive and an explicit timeout) and
// whose exclusive wait that runs out while shared holders drain lets go
// of what it took (EndWait). MySQL is no SetLocker or TxLocker, so the
// party answers ErrUnsupported there: a set's keys go one statement each,
// and LockTx is refused.
func TestAThirdPartysMySQLBackendGetsEveryCapability(t *testing.T) {
	t.Parallel()
	db := testdb.OpenMySQL(t)
	c := &calls{n: map[string]int{}}
	b := party{inner: advisorylock.MySQL(), calls: c}
	partyOps(t, db, b)

	// An exclusive wait that runs out behind a shared holder.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	name := testdb.UniqueName(t)
	reader, err := newLock(t, db, name).TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, reader)
	if _, err := newLock(t, db, name, advisorylock.WithBackend(b)).LockTimeout(ctx, 300*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout behind a shared holder = %v, want ErrTimeout", err)
	}

	// A transaction lock, which the backend refuses (ErrUnsupported from
	// TryLockTx), leaving the transaction usable.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := newLock(t, db, name, advisorylock.WithBackend(b)).LockTx(ctx, tx); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("LockTx through %s = %v, want ErrUnsupported", b.Name(), err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("Commit after the refused LockTx: %v", err)
	}

	wantCalls(t, c, "Validator", "Configurer", "Traits", "SessionIdentifier", "SlotLocker", "MultiplexLocker", "SetLocker", "ReleaseSignaler", "SharedSessionLocker", "SharedSessionLocker.EndWait", "TermKeeper.PrepareElections", "TermKeeper.BeginTerm", "TermKeeper.EndTerm", "TxLocker.TryLockTx", "TableChecker", "RunRecorder.RunDone", "RunRecorder.RecordRun")
	if want := (settings{deadHolder: 10 * time.Second, serverChecks: true}); !c.gave(want) {
		t.Errorf("Configure was given %+v, never %+v (the Lock's WithDeadHolderTimeout with a keep-alive)", c.settings, want)
	}
	if c.gave(settings{deadHolder: 20 * time.Second, serverChecks: true}) {
		t.Errorf("Configure was given the default dead-holder timeout on a backend whose sessions then end when idle: %+v", c.settings)
	}
}
