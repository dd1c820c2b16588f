package advisorylock_test

// The plug-in contract: a backend of a third party's making gets every
// capability the built-in ones have, through the exported interfaces of
// backend.go alone.

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
// implements the optional interfaces of backend.go by forwarding to a
// built-in backend through those same interfaces only (it cannot see the
// built-in's unexported methods), counting the calls of each interface
// (and, where an interface has several jobs, of each job).
type party struct {
	inner backend.Backend
	calls *calls
}

// wrap returns b as a party, counting into p's calls.
func (p party) wrap(b backend.Backend) backend.SessionLocker {
	return party{inner: b, calls: p.calls}
}

// Configurer
func (p party) Configure(db backend.DB, deadHolder time.Duration, serverChecks bool) backend.Backend {
	p.calls.configure(settings{deadHolder, serverChecks})
	return p.wrap(p.inner.(backend.Configurer).Configure(db, deadHolder, serverChecks))
}

// SharedSessionLocker
func (p party) Shared() backend.SessionLocker {
	p.calls.add("SharedSessionLocker")
	return p.wrap(p.inner.(backend.SharedSessionLocker).Shared())
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
	c.add("Configurer")
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

func (p party) heldKeysCalls() int { return p.calls.count("MultiKeyLocker.HeldKeys") }

func (c *calls) count(iface string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[iface]
}

func (p party) session() backend.SessionLocker { return p.inner.(backend.SessionLocker) }
func (p party) store() backend.LeaseStore      { return p.inner.(backend.LeaseStore) }

func (p party) Name() string { return "party-" + p.inner.Name() }
func (p party) Validate(ctx context.Context, db backend.DB) error {
	return p.inner.Validate(ctx, db)
}
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
func (p party) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	return p.session().SessionIdentity(ctx, conn)
}
func (p party) SessionHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	return p.session().SessionHolder(ctx, db, key)
}

// LeaseStore: the tables of the session backend's terms and windows are
// checked through it.
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
func (p party) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) error {
	return p.store().AdmitToken(ctx, tx, resource, token)
}
func (p party) Schema() string { return p.store().Schema() }
func (p party) CheckTables(ctx context.Context, db backend.DB, tables ...string) error {
	p.calls.add("LeaseStore.CheckTables")
	return p.store().CheckTables(ctx, db, tables...)
}
func (p party) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	return p.store().LeaseHolders(ctx, db, r)
}

// LeaseStore: TryDoOnce's records of runs, and a LeaseLock waiter's
// listener.
func (p party) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	p.calls.add("LeaseStore.RunDone")
	return p.store().RunDone(ctx, db, name, run)
}
func (p party) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	p.calls.add("LeaseStore.RecordRun")
	return p.store().RecordRun(ctx, db, name, run, now, keep)
}
func (p party) ListenReleases(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64)) error {
	p.calls.add("LeaseStore.ListenReleases")
	return p.store().ListenReleases(ctx, db, conn, ready, released)
}

// LeaseStore's waiters in line: a LeaseLock waiter's place, the listener
// that tells it a release handed it the lease, and its sleep in line
// where releases are not heard.
func (p party) QueueLease(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest) (uint64, error) {
	p.calls.add("LeaseStore.QueueLease")
	defer p.calls.add("LeaseStore.QueueLease returned")
	q, ok := p.inner.(queuer)
	if !ok {
		return 0, advisorylock.ErrUnsupported
	}
	return q.QueueLease(ctx, db, conn, r)
}
func (p party) SleepInLine(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest, d time.Duration) (bool, error) {
	p.calls.add("LeaseStore.SleepInLine")
	q, ok := p.inner.(queuer)
	if !ok {
		return false, advisorylock.ErrUnsupported
	}
	return q.SleepInLine(ctx, db, conn, r, d)
}
func (p party) ListenGrants(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error {
	p.calls.add("LeaseStore.ListenGrants")
	q, ok := p.inner.(queuer)
	if !ok {
		return advisorylock.ErrUnsupported
	}
	return q.ListenGrants(ctx, db, conn, ready, released)
}

// MultiKeyLocker: a semaphore's slots, a set's keys, multiplexed locks.
func (p party) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	p.calls.add("MultiKeyLocker")
	return p.inner.(advisorylock.MultiKeyLocker).TryLockAny(ctx, conn, keys)
}
func (p party) KeyHolders(ctx context.Context, db backend.DB, keys []int64) ([]*backend.Holder, error) {
	p.calls.add("MultiKeyLocker")
	return p.inner.(advisorylock.MultiKeyLocker).KeyHolders(ctx, db, keys)
}
func (p party) TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	p.calls.add("MultiKeyLocker.TryLockAll")
	return p.inner.(advisorylock.MultiKeyLocker).TryLockAll(ctx, conn, keys)
}
func (p party) UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	p.calls.add("MultiKeyLocker.TryLockAll")
	return p.inner.(advisorylock.MultiKeyLocker).UnlockAll(ctx, conn, keys)
}
func (p party) UnlockAndSignal(ctx context.Context, conn *sql.Conn, key, signal int64) (backend.SessionResult, error) {
	p.calls.add("MultiKeyLocker.UnlockAndSignal")
	return p.inner.(advisorylock.MultiKeyLocker).UnlockAndSignal(ctx, conn, key, signal)
}
func (p party) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	p.calls.add("MultiKeyLocker.HeldKeys")
	return p.inner.(advisorylock.MultiKeyLocker).HeldKeys(ctx, conn, keys)
}

// SharedSessionLocker
func (p party) SessionHolders(ctx context.Context, db backend.DB, key int64) ([]*backend.Holder, error) {
	p.calls.add("SharedSessionLocker")
	return p.inner.(backend.SharedSessionLocker).SessionHolders(ctx, db, key)
}
func (p party) EndWait(ctx context.Context, conn *sql.Conn, key int64) error {
	p.calls.add("SharedSessionLocker.EndWait")
	return p.inner.(backend.SharedSessionLocker).EndWait(ctx, conn, key)
}

// SessionLocker: an Election's terms.
func (p party) PrepareElections(ctx context.Context, db backend.DB) error {
	return p.session().PrepareElections(ctx, db)
}
func (p party) BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (uint64, error) {
	return p.session().BeginTerm(ctx, conn, key, name, owner)
}
func (p party) TermHolder(ctx context.Context, db backend.DB, key int64, name string) (*backend.Holder, error) {
	return p.session().TermHolder(ctx, db, key, name)
}
func (p party) EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error {
	p.calls.add("SessionLocker.EndTerm")
	return p.session().EndTerm(ctx, conn, name, term)
}

// SessionLocker: transaction locks (ErrUnsupported over MySQL).
func (p party) TryLockTx(ctx context.Context, tx *sql.Tx, key int64) (bool, error) {
	p.calls.add("SessionLocker.TryLockTx")
	return p.session().TryLockTx(ctx, tx, key)
}
func (p party) TxSettings(ctx context.Context, tx *sql.Tx) (map[string]string, error) {
	p.calls.add("SessionLocker.WaitLockTx")
	return p.session().TxSettings(ctx, tx)
}
func (p party) WaitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev map[string]string) (bool, error) {
	p.calls.add("SessionLocker.WaitLockTx")
	return p.session().WaitLockTx(ctx, tx, key, slice, prev)
}

// queuer is a LeaseStore with waiters in line that may sleep in line
// (see LeaseStore).
type queuer interface {
	backend.LeaseStore
	QueueLease(ctx context.Context, db advisorylock.DB, conn *sql.Conn, r backend.LeaseRequest) (advisorylock.FencingToken, error)
	ListenGrants(ctx context.Context, db advisorylock.DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error
	SleepInLine(ctx context.Context, db advisorylock.DB, conn *sql.Conn, r backend.LeaseRequest, d time.Duration) (bool, error)
}

// The interfaces a party implements, checked by the compiler.
var _ interface {
	backend.Configurer
	queuer
	advisorylock.MultiKeyLocker
	backend.SharedSessionLocker
} = party{}

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
// and listens for a LeaseLock waiter: every optional interface, and
// every optional job of LeaseStore, is called.
func TestAThirdPartysBackendGetsEveryCapability(t *testing.T) {
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
			testdb.WaitFor(t, wait, func() bool { return c.count("SessionLocker.WaitLockTx") > 0 }, "LockTx never waited through the third party's WaitLockTx")
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
			testdb.WaitFor(t, wait, func() bool { return c.count("LeaseStore.ListenGrants") > 0 && c.count("LeaseStore.QueueLease") > 0 },
				"a LeaseLock waiter never listened through the third party's ListenGrants, or never queued through its QueueLease")
			lease := []string{"LeaseStore.QueueLease", "LeaseStore.ListenGrants"}
			if drv == "postgres" {
				testdb.WaitFor(t, wait, func() bool { return c.count("LeaseStore.SleepInLine") > 0 },
					"a LeaseLock waiter on lib/pq never slept in line through the third party's SleepInLine")
				lease = append(lease, "LeaseStore.SleepInLine")
			}
			if err := lg.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-lgot; err != nil {
				t.Fatalf("LeaseLock.Lock through the third party: %v", err)
			}

			wantCalls(t, c, "Configurer", "Traits", "MultiKeyLocker", "MultiKeyLocker.HeldKeys", "MultiKeyLocker.TryLockAll", "MultiKeyLocker.UnlockAndSignal", "SharedSessionLocker", "SessionLocker.TryLockTx", "SessionLocker.WaitLockTx", "SessionLocker.EndTerm", "LeaseStore.CheckTables", "LeaseStore.RunDone", "LeaseStore.RecordRun")
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
// of what it took (EndWait); its TryLockAll answers ErrUnsupported, so a
// set's keys go one statement each, and its TryLockTx, so LockTx is
// refused.
func TestAThirdPartysMySQLBackendGetsEveryCapability(t *testing.T) {
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

	wantCalls(t, c, "Configurer", "Traits", "MultiKeyLocker", "MultiKeyLocker.HeldKeys", "MultiKeyLocker.TryLockAll", "MultiKeyLocker.UnlockAndSignal", "SharedSessionLocker", "SharedSessionLocker.EndWait", "SessionLocker.EndTerm", "SessionLocker.TryLockTx", "LeaseStore.CheckTables", "LeaseStore.RunDone", "LeaseStore.RecordRun")
	if want := (settings{deadHolder: 10 * time.Second, serverChecks: true}); !c.gave(want) {
		t.Errorf("Configure was given %+v, never %+v (the Lock's WithDeadHolderTimeout with a keep-alive)", c.settings, want)
	}
	if c.gave(settings{deadHolder: 20 * time.Second, serverChecks: true}) {
		t.Errorf("Configure was given the default dead-holder timeout on a backend whose sessions then end when idle: %+v", c.settings)
	}
}
