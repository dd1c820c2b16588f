package backend

import (
	"context"
	"database/sql"
	"time"
)

// Optional capabilities. The library looks for each of these interfaces
// on a Backend (or on what Configure or Shared returns) with a type
// assertion and uses it where found; without it, it does what the
// interface's doc says. The built-in backends of the advisorylock package
// use nothing else, so a third party's backend can do all that they do.
// An optional method may return an error matching ErrUnsupported, before
// it sends anything, where the capability depends on the driver or the
// server; the library then falls back as if the interface were missing,
// unless its doc says otherwise.

// Validator is a Backend that checks a handle before the library locks
// with it. The library calls Validate at the first operation on a
// *sql.DB (once per *sql.DB; skipped with WithServerChecks(false)), and
// the operation fails with its error: a refusal of a handle the backend
// cannot lock safely wraps ErrUnsupported. Without it, no check is made.
type Validator interface {
	Backend
	Validate(ctx context.Context, db DB) error
}

// Recognizer is a Backend that can tell, from a connection, whether the
// database behind it is one it serves. The library calls Recognizes to
// pick a backend for a handle whose driver it cannot name (a wrapped
// driver, such as otelsql's) and that was given no WithBackend: once per
// *sql.DB, on a connection of the handle, asking its candidates in turn
// (the built-in backends) and taking the first that says yes. A backend
// given with WithBackend is used without asking. Without it, a candidate
// is not considered. Recognizes sends at most one statement and returns
// false on any error.
type Recognizer interface {
	Backend
	Recognizes(ctx context.Context, conn *sql.Conn) bool
}

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
// returns a Backend with the same capabilities. Without it, the Backend
// is used as it is, and WithDeadHolderTimeout changes nothing on the
// server.
type Configurer interface {
	Backend
	Configure(db DB, deadHolder time.Duration, serverChecks bool) Backend
}

// SessionIdentifier is a SessionLocker that names the server session
// behind a connection. The library's pooler probe (the first operation of
// a Lock, and advisorylock.DetectPooler) compares the identities of
// connections to see a transaction-mode pooler multiplex sessions, and
// refuses session locks behind one with ErrTransactionPooler. Without
// it, no probe runs (DetectPooler reports no pooler); a release still
// compares SessionResult.Session with its acquire's.
type SessionIdentifier interface {
	SessionLocker
	// SessionIdentity identifies the server session behind conn, so that
	// two connections that report the same identity share one session.
	SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error)
}

// TermKeeper is a SessionLocker that records an Election's terms beside
// the lock its leader holds. (An Election on a LeaseStore needs nothing
// more: the lease's token is the term.) Without it, an Election on the
// SessionLocker fails at its first operation with ErrUnsupported.
type TermKeeper interface {
	SessionLocker
	// PrepareElections makes ready what terms need (a table), at an
	// Election's first operation.
	PrepareElections(ctx context.Context, db DB) error
	// BeginTerm records, on conn, whose session was just granted key's
	// lock, a new term of the election name led by owner, and returns it:
	// a token larger than every token issued before it, by this election
	// or by a lease. One statement.
	BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (term uint64, err error)
	// TermHolder reports the leader of name: its latest term, if the
	// session that began it still holds key's lock and EndTerm has not
	// ended it; nil otherwise.
	TermHolder(ctx context.Context, db DB, key int64, name string) (*Holder, error)
	// EndTerm marks term of name ended in its record when the leader
	// resigns, on the leader's conn, so that TermHolder no longer reports
	// it while the session lives on in the pool. Failing, it costs only
	// that: TermHolder then tells by the session's lock.
	EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error
}

// TxLocker is a SessionLocker that also takes its locks in the caller's
// transaction, which ends with it (Lock.LockTx, Lock.TryLockTx). No
// method may leave tx aborted when it returns a nil error. Without it,
// LockTx and TryLockTx fail with ErrUnsupported, before anything is sent.
type TxLocker interface {
	SessionLocker
	// TryLockTx makes one attempt in tx; false is a definite miss.
	TryLockTx(ctx context.Context, tx *sql.Tx, key int64) (bool, error)
	// TxSettings reads, by name, the settings of tx that WaitLockTx
	// changes (PostgreSQL: statement_timeout and lock_timeout).
	TxSettings(ctx context.Context, tx *sql.Tx) (map[string]string, error)
	// WaitLockTx waits server-side in tx for at most slice; false means
	// the slice ended without the lock and tx is as it was. After a grant
	// it puts back the settings it changed, to prev (from TxSettings).
	WaitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev map[string]string) (bool, error)
}

// SharedSessionLocker is a SessionLocker that also takes shared locks
// (RLock). Without it, RLock on the backend fails with ErrUnsupported.
type SharedSessionLocker interface {
	SessionLocker
	// Shared returns the same backend whose statements take, wait for,
	// check and release keys in shared mode.
	Shared() SessionLocker
	// SessionHolders lists every holder of key, shared and exclusive.
	// (Without the interface, Holders reports what SessionHolder does.)
	SessionHolders(ctx context.Context, db DB, key int64) ([]*Holder, error)
	// EndWait lets go of what an exclusive wait that ended without the
	// lock, between slices, may have left on the session (MySQL: a writer
	// keeps the GET_LOCK that holds new shared holders off while shared
	// holders drain). The library calls it before the connection goes
	// back to the pool, and discards the connection if it fails. A
	// backend whose waits leave nothing returns nil.
	EndWait(ctx context.Context, conn *sql.Conn, key int64) error
}

// WindowedSessionLocker is a SessionLocker that can keep a name taken for
// a window after each grant (WithMinHold), on the database's clock. A Lock
// with WithMinHold on a SessionLocker that does not implement it fails at
// its first operation with ErrUnsupported. (A LeaseStore keeps windows in
// its rows instead: see Traits.KeepsWindows.)
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

// The interfaces below serve sessions that hold many keys at once. A
// SessionLocker that implements any of them must keep its TryLockSession
// and UnlockSession to their own key, and its session's locks reentrant
// or refused locally: the library never asks one session for a key it
// holds.

// SlotLocker is a SessionLocker that takes and reads a Semaphore's slot
// keys in one statement. Without it (or where a method returns an error
// matching ErrUnsupported), a Semaphore tries its slots one
// TryLockSession each and reads their holders one SessionHolder each.
type SlotLocker interface {
	SessionLocker
	// TryLockAny tries keys in order and takes the first it gets, and no
	// other: it returns that key's index with OK true, or OK false when
	// every key is held elsewhere.
	TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, SessionResult, error)
	// KeyHolders returns holders[i] for keys[i], nil when free, read in
	// one snapshot.
	KeyHolders(ctx context.Context, db DB, keys []int64) ([]*Holder, error)
}

// SetLocker is a SessionLocker that takes and releases a set's keys
// (advisorylock.NewSet) in one statement. Without it (or where a method
// returns an error matching ErrUnsupported), a set's try takes its keys
// one TryLockSession each, letting go of those it took on a miss, and its
// release makes one UnlockSession per key.
type SetLocker interface {
	SessionLocker
	// TryLockAll takes every one of keys on conn's session, or none: OK
	// false is a definite miss that leaves the session holding none of
	// them.
	TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (SessionResult, error)
	// UnlockAll releases every one of keys on conn's session; OK false
	// means the session did not hold one of them.
	UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (SessionResult, error)
}

// MultiplexLocker is a SessionLocker whose session holds the locks of
// many Locks at once (WithMultiplexing) and checks them in one statement:
// the shared session's keep-alive calls HeldKeys, and so does a set's.
// Without it, WithMultiplexing fails at the first operation with
// ErrUnsupported, and a set's keep-alive makes one HoldsSession per key.
type MultiplexLocker interface {
	SessionLocker
	// HeldKeys returns held[i] for keys[i]: whether conn's session still
	// holds it, in one statement (or a few, for many keys). An error,
	// or a server that can no longer grant (a standby, a read-only
	// server), means the session can be trusted with none of them.
	HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error)
}

// BatchLocker is a MultiplexLocker that runs the tries and unlocks of
// many Locks on one shared session in one statement. While a statement
// runs on a shared session, the single-key tries and unlocks that other
// Locks want on it queue, and the next statement carries them all: one
// round trip for many operations, which is what lets multiplexed locks
// keep up with pinned ones under concurrency. Without it (or where
// TryUnlock returns an error matching ErrUnsupported), each runs alone.
type BatchLocker interface {
	MultiplexLocker
	// TryUnlock tries each of try as TryLockSession would (granted[i]
	// for try[i]) and unlocks each of unlock as UnlockSession would
	// (freed[i] for unlock[i]: it was held, and is now free), all in one
	// statement; no key is in both. It returns an error matching
	// ErrUnsupported, having sent nothing, when conn's session has not
	// yet passed the checks of a TryLockSession (the library then runs
	// each alone). Any other error leaves the session's state unknown.
	TryUnlock(ctx context.Context, conn *sql.Conn, try, unlock []int64) (granted, freed []bool, err error)
}

// ReleaseSignaler is a SessionLocker whose Semaphore slot releases wake
// the semaphore's waiters. The library releases every slot of a Semaphore
// with UnlockAndSignal; where the backend is also a ReleaseListener, the
// semaphore's waiters listen for the signal under the semaphore's key,
// and try every slot at once when a slot is released. Without it, a
// slot's release is an UnlockSession and waiters look again at their
// next poll (or wait server-side on one slot, where nothing is heard).
type ReleaseSignaler interface {
	SessionLocker
	// UnlockAndSignal releases key as UnlockSession does and, if it
	// freed it, signals signal to ListenReleases (as ReleaseLease signals
	// a lease's key), once the release is visible. An error matching
	// ErrUnsupported makes the library call UnlockSession instead.
	UnlockAndSignal(ctx context.Context, conn *sql.Conn, key, signal int64) (SessionResult, error)
}

// TableChecker is a LeaseStore with tables to create and grants to
// prove. The library calls CheckTables from every Check (Lock, LeaseLock,
// Election, Fence), also for the tables of a session backend's windows
// and terms. Without it, Check proves nothing about tables.
type TableChecker interface {
	LeaseStore
	// CheckTables creates the named tables (names from Schema) if they
	// are missing and proves, writing nothing, that the role may read and
	// write them, so that Check refuses a missing grant at start-up as
	// the first operation would refuse it.
	CheckTables(ctx context.Context, db DB, tables ...string) error
}

// TokenAdmitter is a LeaseStore that keeps a Fence's highest admitted
// token per resource (advisorylock.NewFence). Without it, Fence.Admit
// fails with ErrUnsupported.
type TokenAdmitter interface {
	LeaseStore
	// AdmitToken stores token as resource's highest in tx if it is not
	// lower than the stored one, and returns the highest stored after it:
	// token itself when admitted, a higher token when token was refused
	// (stale). The library turns a refusal into an error matching
	// advisorylock.ErrStaleToken, and the caller rolls tx back.
	AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (highest uint64, err error)
}

// RunRecorder is a LeaseStore that records runs done, for
// Lock.TryDoOnce (advisorylock_runs). Its methods are called while the
// Lock named name is held (by this store's rows, or by a session lock of
// the same Backend); run is the run key given to TryDoOnce. Without it,
// TryDoOnce fails with ErrUnsupported.
type RunRecorder interface {
	LeaseStore
	// RunDone reports whether run of name is recorded done.
	RunDone(ctx context.Context, db DB, name, run string) (bool, error)
	// RecordRun records run of name done, durably, before it returns, and
	// deletes name's other records older than keep (WithRunRetention)
	// before now (the lock's clock, WithClock, for backends that keep
	// time in the application); a record already there is kept.
	RecordRun(ctx context.Context, db DB, name, run string, now time.Time, keep time.Duration) error
}

// SharedRowStore is a LeaseStore that keeps shared holds (RLock on a Lock
// kept as rows): "shared" requests are one row per shared holder, and
// its "lock" rows and shared rows exclude each other. A "lock" acquire
// with LeaseRequest.Wait that finds only shared holders claims the row
// for the waiter, which keeps new shared holders out until the claim
// expires, is taken, or is released; the waiter's grant after a miss
// (LeaseRequest.Retry) ends its own claim. LeaseHolder of a "lock"
// request reports any live holder, of a "shared" request the exclusive
// one (or a waiting writer's claim). Without it, RLock on a Lock kept as
// rows fails with ErrUnsupported, and Holders reports what LeaseHolder
// does.
type SharedRowStore interface {
	LeaseStore
	// LeaseHolders lists every live holder of r.Key, exclusive and shared.
	LeaseHolders(ctx context.Context, db DB, r LeaseRequest) ([]*Holder, error)
}

// ReleaseListener is a LeaseStore whose ReleaseLease of a "lease" row
// signals the release, so that a waiting LeaseLock tries again when the
// lease is released instead of at its next poll. Without it, LeaseLock
// (and Semaphore) waiters poll.
//
// While LeaseLock waiters wait on a *sql.DB, the library runs one
// listener for it on a connection of the pool that holds no lock and is
// discarded afterwards (or through the handle, where it is a Notifier),
// and none from a pool limited to fewer than four connections. The signal
// is an optimisation: waiters still poll (less often), so a signal lost
// costs latency, never safety.
type ReleaseListener interface {
	LeaseStore
	// ListenReleases listens on conn, given to it alone, until ctx ends
	// or conn fails. It calls ready once it listens (releases before that
	// may go unheard), then released(key) for each release it hears.
	// Where db is a Notifier, conn is nil: the store listens through db.
	// An error matching ErrUnsupported (the driver delivers no
	// notifications, a transaction-mode pooler) makes waiters on db poll;
	// after another error the library listens again while waiters wait.
	ListenReleases(ctx context.Context, db DB, conn *sql.Conn, ready func(), released func(key int64)) error
}

// LeaseQueuer is a LeaseStore whose LeaseLock waiters take a place in
// line: the waiter next in line for a held lease is handed it by the
// holder's release, in the release's own statement, so that the waiter,
// told by the release's signal, holds the lease without a statement (and
// a durable commit) of its own. The library queues a waiter only where it
// hears releases (the store is also a ReleaseListener, and ListenGrants
// listens) or, on a LeaseSleeper, where it can sleep in line, and not for
// a LeaseLock with WithMinHold. Without it, waiters try the row when a
// release is heard and at their polls.
//
// Beside LeaseStore's contract:
//   - While a place is live, AcquireLease grants the lease to no one but
//     its waiter, also after the lease expired.
//   - ReleaseLease (of a grant, or with Token 0 of whatever r.Owner has)
//     hands the lease to the waiter whose place is live: its owner, the
//     place's token, expiring when the place ends. The waiter counts its
//     lease from when it sent the place, so the handover may commit
//     without waiting for durability: lost in a crash, the live place
//     still keeps everyone else out. With Token 0 it also withdraws
//     r.Owner's place.
type LeaseQueuer interface {
	LeaseStore
	// QueueLease gives r.Owner the place for r.TTL from the database's
	// now, or renews its place, and returns the token its grant will
	// carry, above every token issued before. It commits durably. It
	// returns ErrNotAcquired when the lease is free, expired or r.Owner's,
	// or another waiter's place is live; an error matching ErrUnsupported,
	// before it sends anything, where the store keeps no places (its
	// waiters then wait as they would without the interface). conn is nil
	// but for a waiter that sleeps in line (see LeaseSleeper): then the
	// place is taken with a statement on conn.
	QueueLease(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest) (token uint64, err error)
	// ListenGrants is ListenReleases (see ReleaseListener) whose released
	// also names the owner a release handed the lease to ("" for a
	// release that freed it, or where the store cannot tell: the waiter
	// then reads the row); the library calls it instead of
	// ListenReleases.
	ListenGrants(ctx context.Context, db DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error
}

// LeaseSleeper is a LeaseQueuer whose waiters in line sleep on the
// server where releases cannot be heard on db (ListenGrants returned an
// error matching ErrUnsupported). Such a waiter keeps conn, a connection
// of db's, for its whole wait: QueueLease takes the place with a
// statement on conn, and between its passes the waiter calls
// SleepInLine. Without it, such waiters poll.
type LeaseSleeper interface {
	LeaseQueuer
	// SleepInLine waits on conn up to d for the place of token r.Token
	// and returns early, reporting whether the lease is then r.Owner's,
	// when ReleaseLease hands the lease over. An error matching
	// ErrUnsupported (a transaction-mode pooler) makes the waiter poll
	// instead; after another error the library discards conn, and the
	// waiter polls.
	SleepInLine(ctx context.Context, db DB, conn *sql.Conn, r LeaseRequest, d time.Duration) (granted bool, err error)
}

// Notifier is a DB that delivers PostgreSQL notifications to the library
// on a connection of its own, for a driver that hands them to no
// connection of database/sql's pool: lib/pq gives them only to a
// pq.Listener, which extra/advisorylockpq's DB runs. Where a DB is a
// Notifier, the library passes no connection to ListenReleases and
// ListenGrants (conn is nil), and the store listens through the handle;
// the listener then takes no connection from the pool.
//
// Listen LISTENs on channel until ctx ends or its connection fails
// (then it returns an error, and the library calls it again while
// waiters wait). It calls ready once it listens, and again whenever it
// listens anew after a reconnect (notifications sent meanwhile are lost,
// so every waiter then looks again), and notify with the payload of each
// notification it receives. A notification lost costs a waiter latency,
// never safety: it still polls, less often.
type Notifier interface {
	DB
	Listen(ctx context.Context, channel string, ready func(), notify func(payload string)) error
}
