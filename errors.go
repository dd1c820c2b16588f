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
	// ErrTimeout is matched by *TimeoutError.
	ErrTimeout = errors.New("advisorylock: timed out")
	// ErrLockLost means a held lock is gone: its session ended, or its
	// lease row expired or was taken over.
	ErrLockLost = errors.New("advisorylock: lock lost")
	// ErrLeaseLost is matched by *LeaseLostError.
	ErrLeaseLost = backend.ErrLeaseLost
	// ErrStaleToken is matched by *StaleTokenError.
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

// TimeoutError reports that a bounded acquire ended without the lock.
// It matches ErrTimeout with errors.Is.
type TimeoutError struct {
	Name   string        // the lock's name
	Waited time.Duration // how long the acquire ran
	Budget time.Duration // the d given (0 or less: one attempt)
}

// Error names the lock and the bound it was given: the d, or one attempt
// for a d of 0 or less.
func (e *TimeoutError) Error() string {
	if e.Budget <= 0 {
		return fmt.Sprintf("advisorylock: lock %s: not acquired in the one attempt of a timeout of %s", quoteName(e.Name), e.Budget)
	}
	return fmt.Sprintf("advisorylock: lock %s: not acquired within %s (waited %s)", quoteName(e.Name), e.Budget, e.Waited.Round(time.Millisecond))
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// LeaseLostError reports that a lease ended before its holder released it.
// It matches ErrLeaseLost (and ErrLockLost) with errors.Is.
type LeaseLostError struct {
	Name  string       // the lease's name
	Token FencingToken // the token of the lost grant
}

// Error names the lease and the token of the lost grant.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("advisorylock: lease %s (token %d): lost", quoteName(e.Name), e.Token)
}

// Is reports whether target is ErrLeaseLost or ErrLockLost.
func (e *LeaseLostError) Is(target error) bool {
	return target == ErrLeaseLost || target == ErrLockLost
}

// StaleTokenError reports that a Fence refused a token lower than one it
// already admitted. It matches ErrStaleToken with errors.Is.
type StaleTokenError struct {
	Resource string       // the fenced resource
	Token    FencingToken // the refused token
	Highest  FencingToken // the highest token admitted so far
}

// Error names the resource, the refused token and the highest admitted.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("advisorylock: resource %s: stale fencing token %d (highest admitted %d)", quoteName(e.Resource), e.Token, e.Highest)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

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
