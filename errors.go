package advisorylock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Sentinel errors. Every error the package returns about a lock names the
// lock and wraps one of these (or the driver's error, reachable with
// errors.As), so callers branch with errors.Is.
var (
	// ErrNotAcquired means the lock is held by someone else right now.
	ErrNotAcquired = backend.ErrNotAcquired
	// ErrTimeout means a bounded acquire (LockTimeout, DoTimeout) ended
	// without the lock. The error names the lock, the d given and how
	// long it waited.
	ErrTimeout = errors.New("advisorylock: timed out")
	// ErrLockLost means a held lock is gone: its session ended, or its
	// lease row expired or was taken over. A lost LeaseLock's error names
	// the lease and the token of the lost grant.
	ErrLockLost = errors.New("advisorylock: lock lost")
	// ErrStaleToken means a Fence refused a token lower than one it
	// already admitted. The error names the resource, the refused token
	// and the highest admitted.
	ErrStaleToken = errors.New("advisorylock: stale fencing token")
	// ErrPoolUnavailable means no connection could be checked out of the
	// pool, or, for a lease statement (which runs on the handle itself
	// where it can), none could be dialed: nothing was sent. The driver's
	// error is wrapped with it.
	ErrPoolUnavailable = dbutil.ErrPoolUnavailable
	// ErrTransactionPooler means session locks were refused because
	// sessions are multiplexed by a transaction-mode pooler. Use LeaseLock,
	// or WithLeaseRows for a Lock, a set, a Semaphore or an Election: both
	// keep their holds in rows, one autocommit statement at a time.
	ErrTransactionPooler = dbutil.ErrTransactionPooler
	// ErrUnsupported means the handle cannot be locked safely: an unknown
	// driver without WithBackend, an in-memory SQLite database, a nil handle.
	ErrUnsupported = backend.ErrUnsupported
)

// timeoutErr is the error of a bounded acquire that ended without the
// lock: it names the lock, the d it was given (or the one attempt of a d
// of 0 or less) and how long it waited, and matches ErrTimeout.
func timeoutErr(name string, d, waited time.Duration) error {
	if d <= 0 {
		return &lockError{name: name, err: fmt.Errorf("%w: not acquired in the one attempt of a timeout of %s", ErrTimeout, d)}
	}
	return &lockError{name: name, err: fmt.Errorf("%w: not acquired within %s (waited %s)", ErrTimeout, d, waited.Round(time.Millisecond))}
}

// leaseLostErr is the error of a lease that ended before its holder
// released it: it names the lease and the lost grant's token, and matches
// ErrLockLost.
func leaseLostErr(name string, token FencingToken) error {
	return fmt.Errorf("%w: lease %s (token %d)", ErrLockLost, quoteName(name), token)
}

// staleTokenErr is the error of a Fence that refused token: it names the
// resource, the refused token and the highest admitted, and matches
// ErrStaleToken.
func staleTokenErr(resource string, token, highest FencingToken) error {
	return fmt.Errorf("%w: resource %s refused token %d (highest admitted %d)", ErrStaleToken, quoteName(resource), token, highest)
}

// lockError names the lock an error is about and keeps the cause reachable.
type lockError struct {
	name string
	op   string
	err  error
}

func (e *lockError) Error() string {
	msg := strings.TrimPrefix(e.err.Error(), "advisorylock: ")
	if e.op != "" {
		msg = e.op + ": " + msg
	}
	return "advisorylock: lock " + quoteName(e.name) + ": " + msg
}

func (e *lockError) Unwrap() error { return e.err }

// wrapErr returns err naming the lock and the operation, or nil, with
// the fix of a known misconfiguration (see explain).
func wrapErr(name, op string, err error) error {
	if err == nil {
		return nil
	}
	return &lockError{name: name, op: op, err: explain(err)}
}

// pgxCacheHint is the fix for pgx's statement cache behind a pooler.
const pgxCacheHint = "pgx's cached prepared statements do not survive a transaction pooler such as PgBouncer in transaction mode: add default_query_exec_mode=exec to the DSN"

// explain adds the fix to err where pgx's statement cache ("stmtcache_…")
// met a transaction pooler (SQLSTATE 26000 or 42P05).
func explain(err error) error {
	code := dbutil.SQLState(err)
	msg := err.Error()
	if (code == "26000" || code == "42P05") && strings.Contains(msg, `"stmtcache_`) && !strings.Contains(msg, pgxCacheHint) {
		return fmt.Errorf("%w (%s)", err, pgxCacheHint)
	}
	return err
}

// quoteName quotes a name for a message, shortening very long names.
func quoteName(name string) string {
	const max = 120
	if len(name) > max {
		return strconv.Quote(name[:max]) + "…"
	}
	return strconv.Quote(name)
}
