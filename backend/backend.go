package backend

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"
)

// The errors a backend speaks. The advisorylock package's sentinels of the
// same names are these values, so a backend's error matches them with
// errors.Is, and users see the same text.
var (
	// ErrNotAcquired is what AcquireLease (and QueueLease) return when
	// the row is held by someone else right now.
	ErrNotAcquired = errors.New("advisorylock: held elsewhere")
	// ErrLeaseLost is what RenewLease returns when the renewing owner no
	// longer holds the lease (released, expired or taken over).
	ErrLeaseLost = errors.New("advisorylock: lease lost")
	// ErrUnsupported refuses what a backend cannot do safely: Validate's
	// refusal of a handle, and an optional method's refusal, before it
	// sends anything, of a capability its driver lacks. The library then
	// takes the fallback that the optional interface's doc names.
	ErrUnsupported = errors.New("advisorylock: unsupported")
)

// DB is a handle the library was given: *sql.DB, *sqlx.DB, or a wrapper
// of either. Its method set is advisorylock.DB's, so the user's handle is
// passed through as it is.
type DB interface {
	Conn(ctx context.Context) (*sql.Conn, error)
	Driver() driver.Driver
}

// Holder describes who holds a key, as a backend reads it; the library
// hands it to users as an advisorylock.Holder.
type Holder struct {
	Name        string // the lock's name, where the backend stores it
	Backend     string // the backend's Name
	Key         int64
	PID         int       // the server's session (PostgreSQL backend pid, MySQL connection id); 0 if unknown
	User        string    // the holder's database user, if known
	Application string    // application_name, if known
	ClientAddr  string    // the holder's address, if known
	Owner       string    // the row's owner (LeaseRequest.Owner), for rows
	Token       uint64    // the lease's latest grant, 0 for session locks
	Since       time.Time // when the hold began (or an earlier bound)
	ExpiresAt   time.Time // zero for session locks
	Slot        int       // a semaphore holder's slot; the library sets it
	Shared      bool      // a shared holder, not an exclusive one
}

// Backend is a database dialect. PostgreSQL, MySQL and SQLite are built
// into the advisorylock package; another is given to it with
// advisorylock.WithBackend. A Backend is used through SessionLocker
// (locks tied to a pinned connection) or LeaseStore (locks and leases
// kept as rows); it implements at least one of them, and any of the
// optional interfaces. Its methods may be called concurrently.
type Backend interface {
	// Name is a short label, such as "postgres"; it shows in
	// Holder.Backend and in error messages.
	Name() string
	// Traits reports what the library may rely on beyond the methods.
	// The library reads it from the Backend it uses (what Configure
	// returned, on a Configurer), so it may depend on the driver.
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
	// wait_timeout). The library then passes a deadHolder only to a Lock
	// with a keep-alive and an explicit WithDeadHolderTimeout: the
	// setting stays on the pooled session, whose server closes it when
	// idle.
	EndsIdleSessions bool
	// KeepsWindows: the LeaseStore honours LeaseRequest.MinHold. Where
	// false, a Lock or LeaseLock with WithMinHold on the store fails at
	// its first operation with ErrUnsupported.
	KeepsWindows bool
}

// SessionLocker is a Backend whose locks live as long as a database
// session: the lock is taken on a pinned connection and ends with it.
// Every method is one round trip and must leave conn usable when it
// returns a nil error.
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
	// SessionHolder reports who holds key, or nil when it is free.
	SessionHolder(ctx context.Context, db DB, key int64) (*Holder, error)
}

// SessionResult is the outcome of one session-lock statement.
type SessionResult struct {
	OK bool // acquired, or released
	// Session is the server session that ran the statement (PostgreSQL
	// backend pid), 0 if unknown. The library compares the sessions of a
	// lock's acquire and release: differing, a pooler moved the
	// connection.
	Session int64
}

// LeaseStore is a Backend that keeps leases as rows. Every method that
// sends a statement sends one (one round trip), committed on its own.
type LeaseStore interface {
	Backend
	// AcquireLease takes the row if it is free or expired, in one atomic
	// statement, and returns the grant's token (the row's new generation;
	// any value >= 1 for a "lock" row); ErrNotAcquired if held.
	AcquireLease(ctx context.Context, db DB, r LeaseRequest) (token uint64, err error)
	// RenewLease extends the lease if r.Owner and r.Token still hold it
	// and it has not expired, and returns its token; ErrLeaseLost
	// otherwise.
	RenewLease(ctx context.Context, db DB, r LeaseRequest) (token uint64, err error)
	// ReleaseLease frees the lease if r.Owner and r.Token still hold it;
	// a lease held by someone else is left alone and nil returned.
	ReleaseLease(ctx context.Context, db DB, r LeaseRequest) error
	// LeaseHolder reports the live holder, or nil when free or expired.
	LeaseHolder(ctx context.Context, db DB, r LeaseRequest) (*Holder, error)
	// Schema returns the DDL of the backend's tables, for migration tools
	// (advisorylock.Schema).
	Schema() string
}

// LeaseRequest describes one lease statement.
type LeaseRequest struct {
	// Kind says which row the request is about: KindLock, KindShared
	// or KindLease.
	Kind  string
	Name  string
	Key   int64
	Owner string        // unique per acquire
	Token uint64        // the grant being renewed or released (0 to acquire)
	TTL   time.Duration // lease length
	Now   time.Time     // the lock's clock (WithClock), for backends that keep time in the application
	// MinHold is the window of WithMinHold (0: none): the row stays taken
	// until the grant's time plus MinHold, through renewals, a release
	// (which keeps the owner until then) and the holder's death. Only a
	// store whose Traits keep windows is given a non-zero MinHold.
	MinHold time.Duration
	// Wait marks a "lock" acquire made by a waiting Lock (not a try): on
	// a SharedRowStore, finding only shared holders it claims the row for
	// its owner.
	Wait bool
	// Retry marks the attempts of a waiting acquire (Wait) after its
	// first: an earlier attempt with this Owner missed and may have left a
	// claim, which a grant then ends. A first attempt has none to end.
	Retry bool
}

// The kinds of LeaseRequest, the values of its Kind. They are also the
// advisorylock package's Event.Kind of the same locks.
const (
	// KindLock is the row behind a Lock on a backend without session
	// locks, or with advisorylock.WithLeaseRows (advisorylock_locks,
	// keyed by Key; a grant's token is any value >= 1).
	KindLock = "lock"
	// KindShared is a shared holder's row of a Lock kept as rows (RLock;
	// see SharedRowStore), one per holder, keyed by Key and Owner.
	KindShared = "shared"
	// KindLease is the row of a LeaseLock (advisorylock_leases, keyed by
	// Name, with a generation that is the fencing token).
	KindLease = "lease"
)
