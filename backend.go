package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// Backend is a database dialect. PostgreSQL, MySQL and SQLite are built
// in; another can be plugged in with WithBackend. A Backend is used through
// the capability interfaces SessionLocker (locks tied to a pinned
// connection) and LeaseStore (locks and leases kept as rows); it implements
// at least one of them, and any of the optional interfaces below. Its
// methods may be called concurrently.
type Backend interface {
	// Name is a short label, such as "postgres"; it shows in Holder.Backend.
	Name() string
	// Validate is called at the first operation on a *sql.DB (once per
	// *sql.DB; skipped with WithServerChecks(false)) and refuses a handle
	// the backend cannot lock safely (wrap ErrUnsupported).
	Validate(ctx context.Context, db DB) error
	// Traits reports what the library may rely on beyond the methods. The
	// library reads it from the Backend it uses (what Configure returned,
	// on a Configurer), so it may depend on the driver.
	Traits() Traits
}

// Traits are facts about a backend that change how the library drives it.
// The zero Traits is always safe: each field, where true, allows the
// library something that is wrong for a backend without the fact.
type Traits struct {
	// CancelsPromptly: the driver ends a statement promptly when the
	// statement's context ends, also on a dead network (pgx and
	// go-sql-driver/mysql close the socket). Where false, the library
	// bounds each statement on a held lock's connection itself, closing
	// the driver connection under a statement that overstays: always
	// safe, one goroutine more per step.
	CancelsPromptly bool
	// EndsIdleSessions: Configure's deadHolder may also end a live
	// holder's session after that long without a statement (MySQL's
	// wait_timeout). The library then passes a DeadHolder only to a Lock
	// with a keep-alive and an explicit WithDeadHolderTimeout: the
	// setting stays on the pooled session, whose server closes it when
	// idle.
	EndsIdleSessions bool
	// KeepsWindows: the LeaseStore honours LeaseRequest.MinHold. Where
	// false, a Lock or LeaseLock with WithMinHold on the store fails at
	// its first operation with ErrUnsupported.
	KeepsWindows bool
	// SharedRows: the LeaseStore keeps shared holds (RLock on a Lock kept
	// as rows): "shared" requests are one row per shared holder, and its
	// "lock" rows and shared rows exclude each other. A "lock" acquire
	// with LeaseRequest.Wait that finds only shared holders claims the
	// row for the waiter, which keeps new shared holders out until the
	// claim expires, is taken, or is released; the waiter's grant after a
	// miss (LeaseRequest.Retry) ends its own claim. LeaseHolder of a
	// "lock" request reports any live holder, of a "shared" request the
	// exclusive one (or a waiting writer's claim), and LeaseHolders lists
	// them all. Where false, RLock on a Lock kept as rows returns
	// ErrUnsupported, and the library never calls LeaseHolders.
	SharedRows bool
	// SignalsReleases: the LeaseStore's ReleaseLease of a "lease" row
	// signals the release to ListenReleases. Where false, the library
	// never calls ListenReleases, and LeaseLock waiters poll.
	SignalsReleases bool
}

// SessionLocker is a Backend whose locks live as long as a database
// session: the lock is taken on a pinned connection and ends with it.
// It also keeps an Election's terms beside the lock, and takes the same
// locks in a transaction, where it can (without, those methods return an
// error matching ErrUnsupported). Every method is one round trip and
// must leave conn usable when it returns a nil error.
//
// For backend authors: see "Writing a backend" in the package doc.
type SessionLocker interface {
	Backend
	// TryLockSession makes one attempt; OK false is a definite miss.
	TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error)
	// WaitLockSession waits server-side for at most slice; OK false means
	// the slice ended without the lock, and the connection is healthy.
	WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (SessionResult, error)
	// UnlockSession releases; OK false means the session did not hold it.
	UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error)
	// HoldsSession reports whether the connection's session still holds key.
	HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error)
	// SessionIdentity identifies the server session behind conn, so that
	// two connections that report the same identity share one session.
	SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error)
	// SessionHolder reports who holds key, or nil when it is free.
	SessionHolder(ctx context.Context, db DB, key int64) (*Holder, error)

	// Elections (NewElection): beside the lock its leader holds, the
	// backend records each term in a row. (On a LeaseStore an Election
	// needs nothing more: the lease's token is the term.)

	// PrepareElections makes ready what terms need (a table), at an
	// Election's first operation. A backend that records no terms
	// returns an error matching ErrUnsupported, and the Election fails
	// with it.
	PrepareElections(ctx context.Context, db DB) error
	// BeginTerm records, on conn, whose session was just granted key's
	// lock, a new term of the election name led by owner, and returns it:
	// a FencingToken larger than every token issued before it, by this
	// election or by a lease. One statement.
	BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (FencingToken, error)
	// TermHolder reports the leader of name: its latest term, if the
	// session that began it still holds key's lock and EndTerm has not
	// ended it; nil otherwise.
	TermHolder(ctx context.Context, db DB, key int64, name string) (*Holder, error)
	// EndTerm marks term of name ended in its record when the leader
	// resigns, on the leader's conn, so that TermHolder no longer reports
	// it while the session lives on in the pool. Failing, it costs only
	// that: TermHolder then tells by the session's lock.
	EndTerm(ctx context.Context, conn *sql.Conn, name string, term FencingToken) error

	// Transaction-scoped locks (Lock.LockTx): a lock taken in the
	// caller's transaction, which ends with it. No method may leave tx
	// aborted when it returns a nil error.

	// TryLockTx makes one attempt in tx; false is a definite miss. A
	// backend without transaction-scoped locks returns an error matching
	// ErrUnsupported, before it sends anything, and LockTx fails with it.
	TryLockTx(ctx context.Context, tx *sql.Tx, key int64) (bool, error)
	// TxSettings reads, by name, the settings of tx that WaitLockTx
	// changes (PostgreSQL: statement_timeout and lock_timeout).
	TxSettings(ctx context.Context, tx *sql.Tx) (map[string]string, error)
	// WaitLockTx waits server-side in tx for at most slice; false means
	// the slice ended without the lock and tx is as it was. After a grant
	// it puts back the settings it changed, to prev (from TxSettings).
	WaitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev map[string]string) (bool, error)
}

// SessionResult is the outcome of one session-lock statement.
//
// For backend authors: see "Writing a backend" in the package doc.
type SessionResult struct {
	OK      bool  // acquired, or released
	Session int64 // the server session that ran it (PostgreSQL backend pid); 0 if unknown
}

// LeaseStore is a Backend that keeps leases as rows, and the tables of
// whatever else it records (windows, terms, runs). Every statement method
// is one statement (one round trip), committed on its own. A store
// without shared rows or release signals says so in its Traits (and the
// library never calls LeaseHolders or ListenReleases); one that keeps no
// runs returns an error matching ErrUnsupported from RunDone and
// RecordRun, before it sends anything.
//
// Waiters in line (optional). A LeaseStore that also has the methods
//
//	QueueLease(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest) (FencingToken, error)
//	ListenGrants(ctx context.Context, db DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error
//
// and optionally
//
//	SleepInLine(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest, d time.Duration) (granted bool, err error)
//
// lets a LeaseLock waiter take the place next in line for a held lease,
// and the holder's release hand the lease to it in the release's own
// statement, so that the waiter, told by the release's signal, holds the
// lease without a statement (and a durable commit) of its own. The
// library queues a waiter only where it hears releases (see
// ListenReleases) or, with SleepInLine, where it can sleep in line, and
// not for a LeaseLock with WithMinHold. The contract, beside the rest of
// LeaseStore's:
//   - QueueLease gives r.Owner the place for r.TTL from the database's
//     now, or renews its place, and returns the token its grant will
//     carry, above every token issued before. It commits durably. It
//     returns ErrNotAcquired when the lease is free, expired or r.Owner's,
//     or another waiter's place is live; ErrUnsupported, before it sends
//     anything, where the store keeps no places (its waiters then wait as
//     they would without the methods).
//   - While a place is live, AcquireLease grants the lease to no one but
//     its waiter, also after the lease expired.
//   - ReleaseLease (of a grant, or with Token 0 of whatever r.Owner has)
//     hands the lease to the waiter whose place is live: its owner, the
//     place's token, expiring when the place ends. The waiter counts its
//     lease from when it sent the place, so the handover may commit
//     without waiting for durability: lost in a crash, the live place
//     still keeps everyone else out. With Token 0 it also withdraws
//     r.Owner's place.
//   - ListenGrants is ListenReleases whose released also names the owner
//     a release handed the lease to ("" for a release that freed it, or
//     where the store cannot tell: the waiter then reads the row); the
//     library calls it instead of ListenReleases.
//   - Where releases cannot be heard on db (ListenGrants returned an
//     error matching ErrUnsupported), a waiter keeps conn, a connection
//     of db's, for its whole wait: QueueLease takes the place with a
//     statement on conn (elsewhere conn is nil), and between its passes
//     the waiter calls SleepInLine, which waits on conn up to d for the
//     place of token r.Token and returns early, reporting whether the
//     lease is then r.Owner's, when ReleaseLease hands the lease over.
//     Its error matching ErrUnsupported (a transaction-mode pooler) makes
//     the waiter poll instead; after another error the library discards
//     conn, and the waiter polls.
//
// For backend authors: see "Writing a backend" in the package doc.
type LeaseStore interface {
	Backend
	// AcquireLease takes the row if it is free or expired, in one atomic
	// statement, and returns the grant's token (the row's new generation;
	// any value >= 1 for a "lock" row); ErrNotAcquired if held.
	AcquireLease(ctx context.Context, db DB, r LeaseRequest) (FencingToken, error)
	// RenewLease extends the lease if r.Owner and r.Token still hold it and
	// it has not expired, and returns its token; ErrLeaseLost otherwise.
	RenewLease(ctx context.Context, db DB, r LeaseRequest) (FencingToken, error)
	// ReleaseLease frees the lease if r.Owner and r.Token still hold it;
	// a lease held by someone else is left alone and nil returned.
	ReleaseLease(ctx context.Context, db DB, r LeaseRequest) error
	// LeaseHolder reports the live holder, or nil when free or expired.
	LeaseHolder(ctx context.Context, db DB, r LeaseRequest) (*Holder, error)
	// AdmitToken stores token as the resource's highest if it is not lower
	// than the stored one, in tx; a lower token gets *StaleTokenError.
	AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token FencingToken) error
	// Schema returns the DDL of the backend's tables, for migration tools.
	Schema() string
	// CheckTables creates the named tables (names from Schema) if they
	// are missing and proves, writing nothing, that the role may read and
	// write them, so that Check refuses a missing grant at start-up as
	// the first operation would refuse it. The library calls it from
	// every Check, also for the tables of a session backend's windows and
	// terms; a backend without grants to prove returns nil.
	CheckTables(ctx context.Context, db DB, tables ...string) error
	// LeaseHolders lists every live holder of r.Key, exclusive and shared
	// (see Traits.SharedRows).
	LeaseHolders(ctx context.Context, db DB, r LeaseRequest) ([]*Holder, error)
	// RunDone reports whether run of name is recorded done, for
	// Lock.TryDoOnce (advisorylock_runs). It and RecordRun are called
	// while the Lock named name is held (by this store's rows, or by a
	// session lock of the same Backend); run is the run key given to
	// TryDoOnce. A store that keeps no runs returns ErrUnsupported, and
	// TryDoOnce fails with it.
	RunDone(ctx context.Context, db DB, name, run string) (bool, error)
	// RecordRun records run of name done, durably, before it returns, and
	// deletes name's other records older than keep (WithRunRetention)
	// before now (the Clock's time, for backends that keep time in the
	// application); a record already there is kept.
	RecordRun(ctx context.Context, db DB, name, run string, now time.Time, keep time.Duration) error
	// ListenReleases listens for the releases ReleaseLease signals (see
	// Traits.SignalsReleases), so that a waiting LeaseLock tries again
	// when the lease is released instead of at its next poll. It listens
	// on conn, given to it alone, until ctx ends or conn fails. It calls
	// ready once it listens (releases before that may go unheard), then
	// released(r.Key) for each release it hears. Where db is a Notifier,
	// conn is nil: the store listens through db.
	//
	// While LeaseLock waiters wait on a *sql.DB, the library runs one
	// listener for it on a connection of the pool that holds no lock and
	// is discarded afterwards (or through the handle, where it is a
	// Notifier), and none from a pool limited to fewer than four
	// connections. The signal is an optimisation: waiters still poll
	// (less often), so a signal lost costs latency, never safety. Where
	// it returns an error matching ErrUnsupported (the driver delivers no
	// notifications, a transaction-mode pooler), waiters on db poll; after
	// another error the library listens again while waiters wait.
	ListenReleases(ctx context.Context, db DB, conn *sql.Conn, ready func(), released func(key int64)) error
}

// leaseQueuer is a LeaseStore whose LeaseLock waiters queue: see "Waiters
// in line" in LeaseStore's documentation.
type leaseQueuer interface {
	LeaseStore
	QueueLease(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest) (FencingToken, error)
	ListenGrants(ctx context.Context, db DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error
}

// leaseSleeper is a leaseQueuer whose waiters in line can sleep on the
// server: see "Waiters in line" in LeaseStore's documentation.
type leaseSleeper interface {
	leaseQueuer
	SleepInLine(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest, d time.Duration) (granted bool, err error)
}

// LeaseRequest describes one lease statement.
//
// For backend authors: see "Writing a backend" in the package doc.
type LeaseRequest struct {
	// Kind says which row the request is about:
	//   - "lock": the row behind a Lock on a backend without session
	//     locks, or with WithLeaseRows (advisorylock_locks, keyed by Key);
	//   - "shared": a shared holder's row of a Lock kept as rows (RLock;
	//     see Traits.SharedRows), one per holder, keyed by Key and Owner;
	//   - "lease": the row of a LeaseLock (advisorylock_leases, keyed by
	//     Name, with a generation that is the fencing token).
	Kind  string
	Name  string
	Key   int64
	Owner string        // unique per acquire
	Token FencingToken  // the grant being renewed or released (0 to acquire)
	TTL   time.Duration // lease length
	Now   time.Time     // the Clock's time, for backends that keep time in the application
	// MinHold is the window of WithMinHold (0: none): the row stays taken
	// until the grant's time plus MinHold, through renewals, a release
	// (which keeps the owner until then) and the holder's death. Only a
	// store whose Traits keep windows is given a non-zero MinHold.
	MinHold time.Duration
	// Wait marks a "lock" acquire made by a waiting Lock (not a try): on
	// a store with shared rows, finding only shared holders it claims the
	// row for its owner (see Traits.SharedRows).
	Wait bool
	// Retry marks the attempts of a waiting acquire (Wait) after its
	// first: an earlier attempt with this Owner missed and may have left a
	// claim, which a grant then ends. A first attempt has none to end.
	Retry bool
}

// Optional capabilities. The library looks for each of these interfaces
// on a Backend (or on what a Backend returns) and uses it where found;
// without one it does what the comment says, or refuses the operation
// with ErrUnsupported. The built-in backends implement them and the
// library uses nothing else of theirs, so a third party's backend can do
// all that they do.

// Configurer is a Backend that adjusts itself to the handle it is given
// (its driver's statement forms) and to the settings of a Lock's
// sessions. The library calls Configure once it knows the handle, with
// deadHolder 0, and uses the Backend it returns for that handle; at a
// Lock's first operation it calls Configure again, on that Backend, with
// the Lock's settings, and uses what it returns for the Lock. deadHolder
// is how long the server may take to free the lock of a holder that
// vanished (WithDeadHolderTimeout; 0 leaves the server's own settings);
// serverChecks is WithServerChecks (false asks for no per-session checks,
// such as PostgreSQL's hot-standby check). Configure does no I/O and
// returns a Backend with the same capabilities. Without it,
// WithDeadHolderTimeout changes nothing on the server.
type Configurer interface {
	Backend
	Configure(db DB, deadHolder time.Duration, serverChecks bool) Backend
}

// SharedSessionLocker is a SessionLocker that also takes shared locks
// (RLock). Without it, RLock on the backend returns ErrUnsupported.
type SharedSessionLocker interface {
	SessionLocker
	// Shared returns the same backend whose statements take, wait for,
	// check and release keys in shared mode.
	Shared() SessionLocker
	// SessionHolders lists every holder of key, shared and exclusive.
	SessionHolders(ctx context.Context, db DB, key int64) ([]*Holder, error)
	// EndWait lets go of what an exclusive wait that ended without the
	// lock, between slices, may have left on the session (MySQL: a writer
	// keeps the GET_LOCK that holds new shared holders off while shared
	// holders drain). The library calls it before the connection goes
	// back to the pool, and discards the connection if it fails. A
	// backend whose waits leave nothing returns nil.
	EndWait(ctx context.Context, conn *sql.Conn, key int64) error
}

// MultiKeyLocker is a SessionLocker whose sessions hold many keys at once
// and which reads or takes several keys in one statement: a Semaphore's
// slots (TryLockAny, KeyHolders, UnlockAndSignal), a set's keys
// (TryLockAll, UnlockAll, see NewSet) and the locks of Locks that share a
// session (WithMultiplexing; HeldKeys, in the session's keep-alive). Its
// TryLockSession and UnlockSession must touch no key but their own, and a
// session's locks must be reentrant or refused locally: the library never
// asks one session for a key it holds.
//
// TryLockAny, KeyHolders, TryLockAll and UnlockAll may return an error
// matching ErrUnsupported, before they send anything: the library then
// makes one statement per key, as it does for a backend without the
// interface (a set's try letting go of those it took on a miss). Without
// the interface WithMultiplexing fails at the first operation with
// ErrUnsupported.
type MultiKeyLocker interface {
	SessionLocker
	// TryLockAny tries keys in order and takes the first it gets, and no
	// other: it returns that key's index with OK true, or OK false when
	// every key is held elsewhere.
	TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, SessionResult, error)
	// KeyHolders returns holders[i] for keys[i], nil when free, read in
	// one snapshot.
	KeyHolders(ctx context.Context, db DB, keys []int64) ([]*Holder, error)
	// TryLockAll takes every one of keys on conn's session, or none: OK
	// false is a definite miss that leaves the session holding none of
	// them.
	TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (SessionResult, error)
	// UnlockAll releases every one of keys on conn's session; OK false
	// means the session did not hold one of them.
	UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (SessionResult, error)
	// HeldKeys returns held[i] for keys[i]: whether conn's session still
	// holds it, in one statement (or a few, for many keys). An error,
	// or a server that can no longer grant (a standby, a read-only
	// server), means the session can be trusted with none of them.
	HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error)
	// UnlockAndSignal releases key as UnlockSession does and, if it
	// freed it, signals signal to the ListenReleases of the same backend
	// (as ReleaseLease signals a lease's key), once the release is
	// visible: a Semaphore's slot release, so that its waiters try every
	// slot at once. A backend that is a LeaseStore with
	// Traits.SignalsReleases must signal here too: a Semaphore's waiters
	// on it wait for the signal, and without one they look again only at
	// their next poll. It may return an error matching ErrUnsupported
	// before it sends anything; the library then calls UnlockSession.
	UnlockAndSignal(ctx context.Context, conn *sql.Conn, key, signal int64) (SessionResult, error)
}

// WindowedSessionLocker is a SessionLocker that can keep a name taken for
// a window after each grant (WithMinHold), on the database's clock. A Lock
// with WithMinHold on a SessionLocker that does not implement it fails at
// its first operation with ErrUnsupported. (A LeaseStore keeps windows in
// its rows instead: see Traits.KeepsWindows.)
//
// For backend authors: see "Writing a backend" in the package doc.
type WindowedSessionLocker interface {
	SessionLocker
	// PrepareWindows makes ready what windows need (PostgreSQL: the
	// advisorylock_windows table), once per Lock, at its first operation.
	PrepareWindows(ctx context.Context, db DB) error
	// TryLockSessionFor is TryLockSession for a name kept taken for window
	// after each grant: in one statement it refuses while an earlier
	// grant's window is open (without trying the lock), takes the lock,
	// and records the new window, which starts at the database's now. If
	// it cannot record the window it must not keep the lock.
	TryLockSessionFor(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (SessionResult, error)
	// ClaimWindow records the window of a lock that conn's session was
	// just granted by WaitLockSession, in a statement of its own (the
	// wait's snapshot is older than the wait). If an earlier grant's
	// window is still open it releases the lock and reports OK false.
	ClaimWindow(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (SessionResult, error)
	// WindowLeft reports how long key's window stays open by the
	// database's clock; 0 when none is.
	WindowLeft(ctx context.Context, conn *sql.Conn, key int64) (time.Duration, error)
	// WindowHolder reports the grant whose window on key is open (its
	// ExpiresAt the window's end), or nil.
	WindowHolder(ctx context.Context, db DB, key int64) (*Holder, error)
}

// localBackend returns the backend that needs no I/O to pick: the
// configured one, else the one the driver's type names; nil when neither
// tells (a wrapped driver: firstUse asks the database).
func localBackend(db DB, c *config) Backend {
	b := c.backend
	if b == nil {
		b = backendForDriver(db)
	}
	return configured(b, db, c)
}

// configured returns b adjusted to db (see Configurer), or b itself.
func configured(b Backend, db DB, c *config) Backend {
	if cf, ok := b.(Configurer); ok {
		return cf.Configure(db, 0, c.serverChecks)
	}
	return b
}

// isNil reports a nil db, also a typed nil pointer in the interface.
func isNil(db DB) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// errNilDB is what the constructors return for a nil db.
var errNilDB = fmt.Errorf("%w: nil DB", ErrUnsupported)

// resolveBackend picks the backend at an operation that may talk to the
// database: the local one (see localBackend), else the one the database
// says it is, asked once per *sql.DB. Unless the server checks are off it
// then runs the backend's Validate, once per *sql.DB.
func resolveBackend(ctx context.Context, db DB, c *config) (Backend, error) {
	if isNil(db) {
		return nil, errNilDB
	}
	b := localBackend(db, c)
	if b == nil {
		var err error
		b, err = cachedVerdict(ctx, db, "backend", func(ctx context.Context) (Backend, error) {
			if b := backendByAsking(ctx, db); b != nil {
				return b, nil
			}
			return nil, fmt.Errorf("%w: cannot tell which database driver %T talks to; pass WithBackend(Postgres()), WithBackend(SQLite()) or WithBackend(MySQL())", ErrUnsupported, db.Driver())
		})
		if err != nil {
			return nil, err
		}
		b = configured(b, db, c)
	}
	if !c.serverChecks {
		return b, nil
	}
	_, err := cachedVerdict(ctx, db, "validate "+b.Name(), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, b.Validate(ctx, db)
	})
	return b, err
}

// firstUse runs a lock's first-use work once, under the context of the
// first operation that needs it: whatever needs the database (see
// resolveBackend), so that constructors do no I/O, as sql.Open. A failure
// is not kept: the next operation tries again. Operations that arrive
// while it runs wait for it, as long as their own context allows.
type firstUse[T any] struct {
	turn chan struct{} // a token: whoever holds it runs the work
	v    atomic.Pointer[T]
}

func newFirstUse[T any]() firstUse[T] { return firstUse[T]{turn: make(chan struct{}, 1)} }

// get returns the work's result, running it first if no run succeeded yet.
func (f *firstUse[T]) get(ctx context.Context, work func(ctx context.Context) (*T, error)) (*T, error) {
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	select {
	case f.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-f.turn }()
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	v, err := work(ctx)
	if err != nil {
		return nil, err
	}
	f.v.Store(v)
	return v, nil
}

// verdicts caches, per *sql.DB, what first uses learn about it (the
// backend a wrapped driver talks to, Validate's verdict, the pooler
// probe's), and lib/pq's prepared statements (see preparedStatements),
// guarded by mu. Entries are keyed by weak pointers and removed when
// their *sql.DB is garbage collected, so the cache keeps no pool alive. A verdict in
// flight is shared: callers that arrive meanwhile wait for it. A failed
// one is not kept: the next caller decides again.
var verdicts = struct {
	mu sync.Mutex
	m  map[weak.Pointer[sql.DB]]map[string]*verdict
}{m: map[weak.Pointer[sql.DB]]map[string]*verdict{}}

type verdict struct {
	done chan struct{} // closed when val and err are set
	val  any
	err  error
}

// cachedVerdict returns what decide says about db, deciding once per
// *sql.DB and per what. A handle that is not a *sql.DB and embeds none is
// decided on every call.
func cachedVerdict[T any](ctx context.Context, db DB, what string, decide func(ctx context.Context) (T, error)) (T, error) {
	pool := sqlDBOf(db)
	if pool == nil {
		return decide(ctx)
	}
	key := weak.Make(pool)
	for {
		v, mine := verdictFor(pool, key, what)
		if !mine {
			select {
			case <-v.done:
			case <-ctx.Done():
				var zero T
				return zero, context.Cause(ctx)
			}
			if v.err != nil {
				continue // decided under someone else's context: decide again
			}
			return v.val.(T), nil
		}
		val, err := decide(ctx)
		v.val, v.err = val, err
		if err != nil {
			forgetVerdict(key, what, v)
		}
		close(v.done)
		return val, err
	}
}

// verdictFor returns the verdict of what for pool, and mine true when the
// caller made it and must decide it.
func verdictFor(pool *sql.DB, key weak.Pointer[sql.DB], what string) (v *verdict, mine bool) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	byWhat := verdicts.m[key]
	if byWhat == nil {
		byWhat = map[string]*verdict{}
		verdicts.m[key] = byWhat
		runtime.AddCleanup(pool, forgetPool, key)
	}
	if v := byWhat[what]; v != nil {
		return v, false
	}
	v = &verdict{done: make(chan struct{})}
	byWhat[what] = v
	return v, true
}

func forgetVerdict(key weak.Pointer[sql.DB], what string, v *verdict) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	if byWhat := verdicts.m[key]; byWhat[what] == v {
		delete(byWhat, what)
	}
}

func forgetPool(key weak.Pointer[sql.DB]) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	delete(verdicts.m, key)
}

// sqlDBOf returns the *sql.DB behind db: db itself, or the exported
// *sql.DB that a struct such as sqlx.DB embeds; nil if there is none.
func sqlDBOf(db DB) *sql.DB {
	if p, ok := db.(*sql.DB); ok {
		return p
	}
	v := reflect.ValueOf(db)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Anonymous && f.IsExported() && f.Type == reflect.TypeFor[*sql.DB]() {
			p, _ := v.Field(i).Interface().(*sql.DB)
			return p
		}
	}
	return nil
}

// backendForDriver detects the backend from the driver's package path,
// without importing any driver.
func backendForDriver(db DB) Backend {
	switch pkg := driverPkg(db); {
	case pkg == "github.com/lib/pq", strings.HasPrefix(pkg, "github.com/jackc/pgx/"):
		return Postgres()
	case pkg == "github.com/glebarez/go-sqlite", pkg == "modernc.org/sqlite", pkg == "github.com/mattn/go-sqlite3", pkg == "github.com/ncruces/go-sqlite3/driver":
		return SQLite()
	case pkg == "github.com/go-sql-driver/mysql":
		return MySQL()
	}
	return nil
}

// driverPkg returns the import path of the package that defines db's
// driver type, or "".
func driverPkg(db DB) string {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// backendByAsking detects the backend of a wrapped driver (otelsql and
// the like) by asking the database what it is.
func backendByAsking(ctx context.Context, db DB) Backend {
	for _, b := range []Backend{Postgres(), SQLite(), MySQL()} {
		if identifies(ctx, db, b) {
			return b
		}
	}
	return nil
}

// identifies asks db whether it is what b serves.
func identifies(ctx context.Context, db DB, b Backend) bool {
	probe, ok := b.(interface {
		isServedBy(ctx context.Context, conn *sql.Conn) bool
	})
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, defaultReleaseTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	return probe.isServedBy(ctx, conn)
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx share: statements.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// statementsOn returns where a statement that holds no lock runs (lease
// steps, holders): db itself when it runs statements (*sql.DB, *sqlx.DB),
// so that database/sql retries a dead pooled connection with another, as
// it does for any statement; else a connection checked out of db, which
// done returns; the kept connection of an onConn.
//
// Under a pool wait (see withPoolWait) a pool that can be exhausted gives
// a connection checked out within that bound instead.
func statementsOn(ctx context.Context, db DB) (q querier, done func(), err error) {
	if c, ok := db.(onConn); ok {
		return c.conn, func() {}, nil
	}
	if q, ok := db.(querier); ok && (poolWaitOf(ctx) == 0 || !mayWaitForPool(db)) {
		return q, func() {}, nil
	}
	conn, err := takeConn(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close() }, nil
}

// onConn is a DB whose statements run on conn, a connection of DB's that
// its caller keeps (a waiter sleeping in line: see leaseSleeper); what
// needs a connection of its own (a schema upgrade) takes one from DB.
type onConn struct {
	conn *sql.Conn
	DB
}

// unreachable marks as ErrPoolUnavailable the error of a statement that
// never reached the server: dialing for it failed, or the server refused
// the new connection at its connection limit, so nothing was sent.
func unreachable(err error) error {
	if err == nil || errors.Is(err, ErrPoolUnavailable) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || connectionLimit(err) != "" {
		return unavailable(context.Background(), err)
	}
	return err
}

// takeConn checks a connection out of db, within ctx's pool wait if it
// has one (see withPoolWait); a failure is ErrPoolUnavailable.
func takeConn(ctx context.Context, db DB) (*sql.Conn, error) {
	checkout := ctx
	if d := poolWaitOf(ctx); d > 0 {
		var cancel context.CancelFunc
		checkout, cancel = context.WithTimeoutCause(ctx, d, errPoolWait)
		defer cancel()
	}
	conn, err := db.Conn(checkout)
	if err != nil {
		return nil, unavailable(checkout, err)
	}
	return conn, nil
}
