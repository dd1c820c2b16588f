package advisorylocktest

import (
	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// Mock sets go-sqlmock expectations for one backend's lock statements, in
// the library's terms. Make one with Postgres, MySQL or SQLite, and pass
// its Options to the constructor of every lock the test takes on the
// mocked *sql.DB.
//
// Each Expect method appends the statements of one step to the Sqlmock's
// expectations, as sqlmock's own Expect methods do: call them in the order
// the code under test takes its steps, and check mock.ExpectationsWereMet
// at the end. The statements are matched by regular expressions, so the
// Sqlmock must use sqlmock's default QueryMatcherRegexp.
//
// A Mock expects the statements of exclusive Locks and of LeaseLocks,
// without advisorylock.WithMinHold: shared holds (RLock), semaphores,
// elections and once-per-window locks send statements of their own.
// It expects those of acquires and releases only. A session
// Lock (PostgreSQL, MySQL) held longer than its keep-alive interval (10s by
// default) checks its session, and a LeaseLock or a SQLite Lock held longer
// than a third of its TTL (10s by default) renews its row: no Expect method
// expects those statements, so a test that holds a lock that long passes
// advisorylock.WithKeepAlive(0) or a longer advisorylock.WithLeaseTTL too.
// A failed or cancelled step makes the library discard its connection,
// which sqlmock sees as a Close: add mock.ExpectClose() where a test makes
// one fail.
//
// A Mock is not safe for concurrent use, as a Sqlmock's Expect methods are
// not.
type Mock struct {
	mock sqlmock.Sqlmock
	d    dialect
	name string // the lock whose statements are matched; "" for any lock
}

// Postgres returns expectations for the PostgreSQL backend: a Lock is a
// session advisory lock (pg_try_advisory_lock, pg_advisory_lock,
// pg_advisory_unlock), a LeaseLock a row of advisorylock_leases.
func Postgres(mock sqlmock.Sqlmock) *Mock { return &Mock{mock: mock, d: postgresStatements{}} }

// MySQL returns expectations for the MySQL and MariaDB backend: a Lock is
// a named lock (GET_LOCK, RELEASE_LOCK, each statement a query of one row
// of several columns), a LeaseLock a row of advisorylock_leases whose
// token comes back as the statement's last insert id.
func MySQL(mock sqlmock.Sqlmock) *Mock { return &Mock{mock: mock, d: mysqlStatements{}} }

// SQLite returns expectations for the SQLite backend, where a Lock is a
// row of advisorylock_locks and a LeaseLock a row of advisorylock_leases.
// A waiting Lock polls there, so ExpectWaitGranted expects the statements
// of one poll.
func SQLite(mock sqlmock.Sqlmock) *Mock { return &Mock{mock: mock, d: sqliteStatements{}} }

// For returns expectations that match only the statements of the lock
// named name, for a test that takes several locks; the Mock it is called
// on matches those of any lock. Both add to the same Sqlmock.
func (m *Mock) For(name string) *Mock {
	c := *m
	c.name = name
	return &c
}

// Options returns what a lock on the mocked *sql.DB must be constructed
// with: the backend named (sqlmock's driver cannot be detected), the
// server checks off (sqlmock cannot answer them; see
// advisorylock.WithServerChecks), and one session pinned per held lock
// (advisorylock.WithMultiplexing(0)): the Expect methods expect a pinned
// Lock's statements, not those of New's default shared sessions. Every
// constructor takes them: New, NewLeaseLock, NewSemaphore, NewElection,
// NewFence. Options given after them override them.
func (m *Mock) Options() []advisorylock.Option {
	return []advisorylock.Option{advisorylock.WithBackend(m.d.backend()), advisorylock.WithServerChecks(false), advisorylock.WithMultiplexing(0)}
}

// ExpectTryWins expects an acquire that finds the lock free and takes it:
// a TryLock, TryDo, or a Lock or Do that needs no wait (Lock tries first).
func (m *Mock) ExpectTryWins() { m.d.try(m, true) }

// ExpectTryLoses expects a TryLock or TryDo that finds the lock held
// elsewhere: TryLock returns an error matching advisorylock.ErrNotAcquired,
// TryDo false and no error, and the connection goes back to the pool.
func (m *Mock) ExpectTryLoses() { m.d.try(m, false) }

// ExpectWaitGranted expects a Lock or Do that finds the lock held, waits,
// and is granted it in its first wait: on PostgreSQL and MySQL a missed
// try and one server-side wait, on SQLite a missed try, one poll of the
// holder that finds the lock free, and a try that wins.
func (m *Mock) ExpectWaitGranted() { m.d.waitGranted(m) }

// ExpectRelease expects the release of a held Lock: a Guard's Release, or
// the end of Do or TryDo.
func (m *Mock) ExpectRelease() { m.d.release(m, true) }

// ExpectReleaseNotHeld expects a release that finds the lock no longer
// held by the session that took it. The release returns nil: on
// PostgreSQL and MySQL the library logs a warning (and, on PostgreSQL,
// asks pg_locks why first, which this expects too); on SQLite a row
// already gone is nothing to free.
func (m *Mock) ExpectReleaseNotHeld() { m.d.release(m, false) }

// ExpectLeaseWins expects a LeaseLock's acquire (TryLock, TryDo, or a Lock
// or Do on a free lease) that is granted token, which the LeaseGuard's
// Token then returns. It panics if token is 0: a grant's token is at
// least 1.
func (m *Mock) ExpectLeaseWins(token advisorylock.FencingToken) {
	if token == 0 {
		panic("advisorylocktest: ExpectLeaseWins(0): a grant's fencing token is at least 1")
	}
	m.d.acquireLease(m, token)
}

// ExpectLeaseLoses expects a LeaseLock's TryLock or TryDo that finds the
// lease held elsewhere: TryLock returns an error matching
// advisorylock.ErrNotAcquired, TryDo false and no error.
func (m *Mock) ExpectLeaseLoses() { m.d.acquireLease(m, 0) }

// ExpectLeaseRelease expects the release of a held lease: a LeaseGuard's
// Release, or the end of a LeaseLock's Do or TryDo.
func (m *Mock) ExpectLeaseRelease() { m.d.releaseLease(m) }

// dialect is one backend's statements, as sqlmock expectations added to
// m's Sqlmock for the lock m names (any lock when m.name is "").
type dialect interface {
	backend() backend.Backend
	// try expects one acquire attempt of a Lock, granted when won.
	try(m *Mock, won bool)
	// waitGranted expects a waiting acquire of a Lock, granted in its
	// first wait.
	waitGranted(m *Mock)
	// release expects a Lock's release; held false: the session did not
	// hold it any more.
	release(m *Mock, held bool)
	// acquireLease expects a LeaseLock's acquire attempt, granted token;
	// 0: held elsewhere.
	acquireLease(m *Mock, token advisorylock.FencingToken)
	// releaseLease expects the release of a held lease.
	releaseLease(m *Mock)
}
