package advisorylock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
)

// mockLock returns a Lock on a go-sqlmock DB, configured as an application
// that unit-tests with go-sqlmock would configure it.
func mockLock(t *testing.T, opts ...advisorylock.Option) (*advisorylock.Lock, *sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	opts = append([]advisorylock.Option{advisorylock.WithBackend(advisorylock.Postgres()), advisorylock.WithServerChecks(false), pinned}, opts...)
	l, err := advisorylock.New(db, "mocked", opts...)
	if err != nil {
		t.Fatalf("New on sqlmock with WithBackend: %v", err)
	}
	return l, db, mock
}

func lockRows(ok bool, pid int64) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"ok", "pid"}).AddRow(ok, pid)
}

// granted is the result of a try or an unlock that returned its row: the
// lock was granted, or released.
func granted(ok bool) driver.Result {
	if ok {
		return sqlmock.NewResult(0, 1)
	}
	return sqlmock.NewResult(0, 0)
}

// unlockCheck answers the check after an unlock that found nothing to
// release: whether this session holds the key, whether any does, and this
// session's pid.
func unlockCheck(here, anywhere bool, pid int64) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"here", "anywhere", "pid"}).AddRow(here, anywhere, pid)
}

func TestUndetectableDriverNeedsWithBackend(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := advisorylock.New(db, "x")
	if err != nil {
		t.Fatalf("New on an undetectable driver = %v; it does no I/O, so the first operation tells", err)
	}
	_, err = l.TryLock(context.Background())
	if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "WithBackend") {
		t.Fatalf("TryLock on an undetectable driver = %v, want ErrUnsupported naming WithBackend", err)
	}
}

func TestSqlmockLockAndCleanRelease(t *testing.T) {
	l, db, mock := mockLock(t)
	mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(true))
	mock.ExpectExec("pg_advisory_unlock").WillReturnResult(granted(true))
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
	if s := db.Stats(); s.Idle != 1 {
		t.Fatalf("a clean release did not recycle the connection: %+v", s)
	}
}

func TestUnlockErrorDiscardsTheConnection(t *testing.T) {
	l, _, mock := mockLock(t)
	cause := errors.New("connection reset by peer")
	mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(true))
	mock.ExpectExec("pg_advisory_unlock").WillReturnError(cause)
	mock.ExpectClose() // the physical connection is closed, not pooled
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(context.Background()); !errors.Is(err, cause) || !strings.Contains(err.Error(), `"mocked"`) {
		t.Fatalf("Release = %v, want the driver's error, naming the lock", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatalf("connection was not discarded: %v", err)
	}
}

func TestAcquireErrorDiscardsTheConnection(t *testing.T) {
	l, _, mock := mockLock(t)
	cause := errors.New("server closed the connection unexpectedly")
	mock.ExpectExec("pg_try_advisory_lock").WillReturnError(cause)
	mock.ExpectClose()
	if _, err := l.TryLock(context.Background()); !errors.Is(err, cause) {
		t.Fatalf("TryLock = %v, want the driver's error", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatalf("connection was not discarded: %v", err)
	}
}

// An unlock that finds nothing to release, while this session (reached
// anew) or another one holds the lock, means the connection's statements
// reach several server sessions: a transaction-mode pooler.
func TestReleaseOnAnotherSessionIsReportedAsPooler(t *testing.T) {
	for _, c := range []struct {
		name           string
		here, anywhere bool
	}{{"held elsewhere", false, true}, {"held by the session reached next", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			l, _, mock := mockLock(t)
			mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(true))
			mock.ExpectExec("pg_advisory_unlock").WillReturnResult(granted(false))
			mock.ExpectQuery("pg_locks").WillReturnRows(unlockCheck(c.here, c.anywhere, 8))
			mock.ExpectClose()
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Release(context.Background()); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Release landing on another backend = %v, want ErrTransactionPooler", err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestUnlockNotHeldWarnsAndRecycles(t *testing.T) {
	var logs syncBuffer
	l, db, mock := mockLock(t, advisorylock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(true))
	mock.ExpectExec("pg_advisory_unlock").WillReturnResult(granted(false))
	mock.ExpectQuery("pg_locks").WillReturnRows(unlockCheck(false, false, 7))
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "not held") || db.Stats().Idle != 1 {
		t.Fatalf("want a warning and a recycled connection; log %q, stats %+v", logs.String(), db.Stats())
	}
}

// pgError carries a SQLSTATE as lib/pq's and pgx's errors do.
type pgError string

func (e pgError) Error() string    { return "SQLSTATE " + string(e) }
func (e pgError) SQLState() string { return string(e) }

// PostgreSQL keeps a lock granted at the moment a lock_timeout fires and
// still fails the statement with 55P03; the session then holds the lock.
// A timed-out slice must therefore ask, and take such a lock as granted
// rather than pool a connection that holds it.
func TestLockTimeoutRacingAGrantIsAGrant(t *testing.T) {
	l, _, mock := mockLock(t, advisorylock.WithKeepAlive(0))
	mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(false)) // Lock tries first
	mock.ExpectExec("pg_advisory_lock").WillReturnError(pgError("55P03"))
	mock.ExpectQuery("pg_locks").WillReturnRows(lockRows(true, 7))
	mock.ExpectExec("pg_advisory_unlock").WillReturnResult(granted(true))
	g, err := l.LockTimeout(context.Background(), 50*time.Millisecond)
	if err != nil {
		t.Fatalf("LockTimeout whose timeout raced the grant = %v, want the lock", err)
	}
	mustRelease(t, g)
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

func TestLockTimeoutNotGrantedRecyclesTheConnection(t *testing.T) {
	l, db, mock := mockLock(t)
	mock.ExpectExec("pg_try_advisory_lock").WillReturnResult(granted(false))
	mock.ExpectExec("pg_advisory_lock").WillDelayFor(60 * time.Millisecond).WillReturnError(pgError("55P03"))
	mock.ExpectQuery("pg_locks").WillReturnRows(lockRows(false, 7))
	_, err := l.LockTimeout(context.Background(), 50*time.Millisecond)
	if !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout = %v, want ErrTimeout", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
	if s := db.Stats(); s.Idle != 1 {
		t.Fatalf("a definite miss must recycle the connection: %+v", s)
	}
}
