package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// beginTx begins a transaction on db that the test's cleanup rolls back
// if the test has not ended it.
func beginTx(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatalf("BeginTx: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func tryTx(t *testing.T, l *advisorylock.Lock, tx *sql.Tx) bool {
	t.Helper()
	ok, err := l.TryLockTx(context.Background(), tx)
	if err != nil {
		t.Fatalf("TryLockTx: %v", err)
	}
	return ok
}

// TestLockTxExcludesAcrossTransactionsAndSessionLocks: a lock taken in a
// transaction excludes other transactions and session holders of the
// name, until the transaction commits or rolls back; a session holder
// excludes it too.
func TestLockTxExcludesAcrossTransactionsAndSessionLocks(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			a, b := newLock(t, dbA, name), newLock(t, dbB, name)
			for _, end := range []string{"commit", "rollback"} {
				txA := beginTx(t, dbA)
				if err := a.LockTx(ctx, txA); err != nil {
					t.Fatalf("LockTx: %v", err)
				}
				if !tryTx(t, a, txA) {
					t.Fatal("TryLockTx in the holding transaction = false, want true (re-entrant)")
				}
				txB := beginTx(t, dbB)
				if tryTx(t, b, txB) {
					t.Fatal("TryLockTx in another transaction = true while held")
				}
				if _, err := b.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Fatalf("TryLock while a transaction holds it = %v, want ErrNotAcquired", err)
				}
				if n := locksHeld(t, dbB, name); n != 1 {
					t.Fatalf("%d sessions hold the key, want 1", n)
				}
				var err error
				if end == "commit" {
					err = txA.Commit()
				} else {
					err = txA.Rollback()
				}
				if err != nil {
					t.Fatalf("%s: %v", end, err)
				}
				if !tryTx(t, b, txB) {
					t.Fatalf("TryLockTx after the holder's %s = false, want true", end)
				}
				if err := txB.Rollback(); err != nil {
					t.Fatal(err)
				}
			}
			g, err := a.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock once no transaction holds it: %v", err)
			}
			if tryTx(t, b, beginTx(t, dbB)) {
				t.Fatal("TryLockTx = true while a session lock holds the name")
			}
			mustRelease(t, g)
		})
	}
}

// TestLockTxWaitsAndGetsInWhenTheHolderEnds: a waiting LockTx is granted
// once the holding transaction commits, and a session Lock waiting for a
// transaction's lock is granted once it rolls back.
func TestLockTxWaitsAndGetsInWhenTheHolderEnds(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			a, b := newLock(t, dbA, name), newLock(t, dbB, name)
			txA := beginTx(t, dbA)
			if err := a.LockTx(ctx, txA); err != nil {
				t.Fatal(err)
			}
			txB := beginTx(t, dbB)
			got := make(chan error, 1)
			go func() { got <- b.LockTx(ctx, txB) }()
			waitForWaiter(t, dbA, name)
			select {
			case err := <-got:
				t.Fatalf("LockTx returned %v while the lock was held", err)
			default:
			}
			if err := txA.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("LockTx after the holder committed: %v", err)
			}
			gotSession := make(chan error, 1)
			go func() {
				g, err := a.Lock(ctx)
				if err == nil {
					err = g.Release(ctx)
				}
				gotSession <- err
			}()
			waitForWaiter(t, dbA, name)
			if err := txB.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := <-gotSession; err != nil {
				t.Fatalf("Lock after the transaction rolled back: %v", err)
			}
		})
	}
}

// waitForWaiter polls pg_locks until a session waits for name's key.
func waitForWaiter(t *testing.T, db *sql.DB, name string) {
	t.Helper()
	k := uint64(advisorylock.Key(name))
	testdb.WaitFor(t, wait, func() bool {
		var n int
		err := db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, int64(k>>32), int64(k&0xffffffff)).Scan(&n)
		return err == nil && n > 0
	}, "a waiter for %q", name)
}

// txState is what a transaction's caller can see of it: its settings and
// its own writes.
type txState struct {
	LockTimeout, StatementTimeout string
	Rows                          int
}

func readTxState(t *testing.T, tx *sql.Tx) txState {
	t.Helper()
	var s txState
	err := tx.QueryRow("SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), (SELECT count(*) FROM locktx_probe)").
		Scan(&s.LockTimeout, &s.StatementTimeout, &s.Rows)
	if err != nil {
		t.Fatalf("the transaction is not usable: %v", err)
	}
	return s
}

// startProbeTx begins a transaction with settings and a write of its own,
// to see that LockTx leaves them as they were.
func startProbeTx(t *testing.T, db *sql.DB) (*sql.Tx, txState) {
	t.Helper()
	tx := beginTx(t, db)
	for _, q := range []string{
		"SET LOCAL lock_timeout = '7s'",
		"SET LOCAL statement_timeout = '9s'",
		"CREATE TEMP TABLE locktx_probe (v int) ON COMMIT DROP",
		"INSERT INTO locktx_probe VALUES (1)",
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return tx, readTxState(t, tx)
}

// TestLockTxThatEndsWithoutTheLockLeavesTheTransactionUsable: a TryLockTx
// miss, a LockTx whose deadline passes and one whose context is
// cancelled while it waits leave the transaction usable, with its
// settings and writes as they were, and without the lock; a grant leaves
// the settings as they were too. The transaction then commits.
func TestLockTxThatEndsWithoutTheLockLeavesTheTransactionUsable(t *testing.T) {
	testdb.Slow(t, "waits out 1.5 s timeouts, per backend")
	t.Parallel() // names and pools of its own
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			name := testdb.UniqueName(t)
			holderDB, db := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			holder, l := newLock(t, holderDB, name), newLock(t, db, name)
			g, err := holder.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			tx, before := startProbeTx(t, db)

			if tryTx(t, l, tx) {
				t.Fatal("TryLockTx = true while held elsewhere")
			}
			if s := readTxState(t, tx); s != before {
				t.Fatalf("after a TryLockTx miss: %+v, want %+v", s, before)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			start := time.Now()
			err = l.LockTx(ctx, tx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("LockTx past its deadline = %v, want DeadlineExceeded", err)
			}
			if took := time.Since(start); took > 1500*time.Millisecond+timeoutSlack {
				t.Fatalf("LockTx returned %v after a 1.5s deadline", took)
			}
			if s := readTxState(t, tx); s != before {
				t.Fatalf("after LockTx timed out: %+v, want %+v", s, before)
			}

			ctx, cancel = context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- l.LockTx(ctx, tx) }()
			waitForWaiter(t, holderDB, name)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("LockTx cancelled while waiting = %v, want Canceled", err)
			}
			if s := readTxState(t, tx); s != before {
				t.Fatalf("after LockTx was cancelled: %+v, want %+v", s, before)
			}
			if n := locksHeld(t, holderDB, name); n != 1 {
				t.Fatalf("%d sessions hold the key, want 1 (the holder)", n)
			}

			// A wait that gets the lock puts the settings back too.
			ctx, cancel = context.WithTimeout(context.Background(), wait)
			defer cancel()
			go func() { done <- l.LockTx(ctx, tx) }()
			waitForWaiter(t, holderDB, name)
			mustRelease(t, g)
			if err := <-done; err != nil {
				t.Fatalf("LockTx once released: %v", err)
			}
			if s := readTxState(t, tx); s != before {
				t.Fatalf("after LockTx waited and got the lock: %+v, want %+v", s, before)
			}
			if _, err := holder.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock while the transaction holds it = %v, want ErrNotAcquired", err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("Commit: %v", err)
			}
		})
	}
}

// TestLockTxThroughTransactionPool: behind PgBouncer in transaction mode,
// where Lock is refused, LockTx and TryLockTx exclude across transactions
// (every client's statements may land on any server session) and end with
// them, with each driver setting that works there.
func TestLockTxThroughTransactionPool(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	for _, c := range leasePoolerClients {
		t.Run(c.name, func(t *testing.T) {
			dsn := txDSN + c.params
			dbA, dbB := testdb.OpenPostgresDSN(t, c.driver, dsn), testdb.OpenPostgresDSN(t, c.driver, dsn)
			testdb.KeepBusy(t, c.driver, dsn, testdb.PgBouncerPoolSize)
			name := testdb.UniqueName(t)
			a, b := newLock(t, dbA, name), newLock(t, dbB, name)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if _, err := a.TryLock(ctx); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("TryLock behind the transaction pool = %v, want ErrTransactionPooler", err)
			}
			for i := range 3 {
				txA := beginTx(t, dbA)
				if err := a.LockTx(ctx, txA); err != nil {
					t.Fatalf("round %d: LockTx: %v", i, err)
				}
				txB := beginTx(t, dbB)
				if tryTx(t, b, txB) {
					t.Fatalf("round %d: TryLockTx in another transaction = true while held", i)
				}
				got := make(chan error, 1)
				go func() { got <- b.LockTx(ctx, txB) }()
				if err := txA.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("round %d: LockTx after the holder committed: %v", i, err)
				}
				if err := txB.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestLockTxIsUnsupportedWithoutTransactionLocks: SQLite and MySQL have no
// transaction-scoped locks, and a window (WithMinHold) cannot live in a
// transaction: each is ErrUnsupported, with the transaction untouched.
func TestLockTxIsUnsupportedWithoutTransactionLocks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		db   func(t *testing.T) *sql.DB
		opts []advisorylock.Option
	}{
		{"sqlite", func(t *testing.T) *sql.DB { return testdb.OpenSQLite(t, testdb.SQLitePath(t), "") }, nil},
		{"mysql", func(t *testing.T) *sql.DB { return testdb.OpenMySQL(t) }, nil},
		{"postgres min-hold", func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, "postgres") }, []advisorylock.Option{advisorylock.WithMinHold(time.Minute)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := c.db(t)
			l := newLock(t, db, testdb.UniqueName(t), c.opts...)
			tx := beginTx(t, db)
			if err := l.LockTx(context.Background(), tx); !errors.Is(err, advisorylock.ErrUnsupported) {
				t.Fatalf("LockTx = %v, want ErrUnsupported", err)
			}
			if ok, err := l.TryLockTx(context.Background(), tx); ok || !errors.Is(err, advisorylock.ErrUnsupported) {
				t.Fatalf("TryLockTx = %v, %v; want false, ErrUnsupported", ok, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("Commit after the refusal: %v", err)
			}
		})
	}
}

// TestLockTxReportsToTheObserver: a transaction lock's acquires are
// reported with kind "transaction", and a grant's release follows at once
// (the package does not see the commit).
func TestLockTxReportsToTheObserver(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	rec := &observetest.Recorder{}
	name := testdb.UniqueName(t)
	l := newLock(t, db, name, advisorylock.WithObserver(rec))
	tx := beginTx(t, db)
	if err := l.LockTx(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	other := beginTx(t, testdb.OpenPostgres(t, "pgx"))
	if tryTx(t, newLock(t, db, name, advisorylock.WithObserver(rec)), other) {
		t.Fatal("TryLockTx = true while held")
	}
	var got []string
	for _, e := range rec.Events() {
		if e.Kind != "transaction" || e.Backend != "postgres" || e.Name != name {
			t.Fatalf("event %+v: want kind transaction, backend postgres, name %q", e, name)
		}
		got = append(got, string(e.Type)+":"+e.Value)
	}
	want := []string{"acquire_start:", "acquire_end:acquired", "release:", "acquire_start:", "acquire_end:not_acquired"}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
}
