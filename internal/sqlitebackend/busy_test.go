package sqlitebackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// sqliteCoded is a driver error with a result code, as glebarez/go-sqlite
// and modernc.org/sqlite report them.
type sqliteCoded int

func (e sqliteCoded) Error() string { return "sqlite error (" + strconv.Itoa(int(e)) + ")" }
func (e sqliteCoded) Code() int     { return int(e) }

func TestSQLiteBusyIsToldFromOtherErrors(t *testing.T) {
	for _, c := range []struct {
		err   error
		busy  bool
		retry bool
	}{
		{sqliteCoded(5), true, true},    // SQLITE_BUSY
		{sqliteCoded(6), true, true},    // SQLITE_LOCKED
		{sqliteCoded(261), true, true},  // SQLITE_BUSY_RECOVERY
		{sqliteCoded(262), true, true},  // SQLITE_LOCKED_SHAREDCACHE
		{sqliteCoded(517), true, false}, // SQLITE_BUSY_SNAPSHOT: only a new transaction helps
		{fmt.Errorf("exec: %w", sqliteCoded(5)), true, true},
		{sqliteCoded(1), false, false},                 // SQLITE_ERROR
		{sqliteCoded(19), false, false},                // SQLITE_CONSTRAINT
		{errors.New("database is locked"), true, true}, // mattn/go-sqlite3
		{errors.New("database table is locked: advisorylock_locks"), true, true},
		{errors.New("no such table: advisorylock_locks"), false, false},
		{context.DeadlineExceeded, false, false},
	} {
		if got := isBusy(c.err); got != c.busy {
			t.Errorf("isBusy(%v) = %v, want %v", c.err, got, c.busy)
		}
		calls := 0
		ctx, cancel := context.WithCancel(context.Background())
		err := retryBusy(ctx, busyNewcomer, func() error {
			calls++
			if calls == 3 {
				cancel()
			}
			return c.err
		})
		cancel()
		if retried := calls > 1; retried != c.retry {
			t.Errorf("retryBusy(%v): %d calls; retried %v, want %v", c.err, calls, retried, c.retry)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("retryBusy(%v) returned %v, which does not wrap the driver's error", c.err, err)
		}
		if c.retry && !errors.Is(err, context.Canceled) {
			t.Errorf("retryBusy(%v) ended by its context returned %v, want context.Canceled", c.err, err)
		}
	}
}

func TestSQLiteRecognizesSQLite(t *testing.T) {
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if !(sqliteBackend{}).Recognizes(ctx, conn) {
		t.Fatal("Recognizes false on a SQLite connection")
	}
}
