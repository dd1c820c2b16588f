package advisorylock_test

// The deprecated Guard.Conn: a lending of WithConn's kind that lasts until
// the release. Delete this file with Guard.Conn.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// guardConn is g.Conn(), the deprecated call, made in this one place
// (staticcheck does not flag a module's uses of its own deprecated names).
func guardConn(g *advisorylock.Guard) advisorylock.Conn {
	return g.Conn()
}

// TestGuardConnRunsQueriesInsideDoOnAPoolOfOne: with SetMaxOpenConns(1),
// statements, a prepared statement and a transaction run on the
// deprecated Guard.Conn inside Do, on the session that holds the lock;
// every call of Conn gives the same lending; after Do the Conn fails with
// sql.ErrConnDone and the pool has its connection back.
func TestGuardConnRunsQueriesInsideDoOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			db.SetMaxOpenConns(1)
			name := testdb.UniqueName(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			var kept advisorylock.Conn
			err := newPinned(t, db, name).Do(ctx, func(ctx context.Context) error {
				c := guardConn(advisorylock.GuardFromContext(ctx))
				kept = c
				var holds bool
				if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
					return fmt.Errorf("the session of Guard.Conn holds the lock: %v, %v; want true", holds, err)
				}
				if _, err := c.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
					return fmt.Errorf("ExecContext: %w", err)
				}
				tx, err := guardConn(advisorylock.GuardFromContext(ctx)).BeginTx(ctx, nil)
				if err != nil {
					return fmt.Errorf("BeginTx on a second call of Conn: %w", err)
				}
				stmt, err := tx.PrepareContext(ctx, "INSERT INTO "+table+" VALUES (2)")
				if err != nil {
					return fmt.Errorf("Tx.PrepareContext: %w", err)
				}
				if _, err := stmt.ExecContext(ctx); err != nil {
					return fmt.Errorf("Stmt.ExecContext: %w", err)
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (3)"); err != nil {
					return fmt.Errorf("Tx.ExecContext: %w", err)
				}
				if err := tx.Commit(); err != nil {
					return fmt.Errorf("Commit: %w", err)
				}
				var n int
				if err := c.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 3 {
					return fmt.Errorf("rows written through Guard.Conn: %d, %v; want 3", n, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kept.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrConnDone) {
				t.Fatalf("a statement on Guard.Conn after Do = %v, want sql.ErrConnDone", err)
			}
			if st := db.Stats(); st.InUse != 0 {
				t.Fatalf("after Do: InUse = %d, want 0", st.InUse)
			}
		})
	}
}

// TestGuardConnReleaseEndsWhatWasLeftOpen: Release rolls back the
// transaction left open on the deprecated Guard.Conn (its write is not
// kept, Commit fails, the statement prepared on it is closed), closes its
// rows, and frees the lock; after Release every call on the Conn fails
// with sql.ErrConnDone, so does a Conn asked for then, and the pool has
// its connection back.
func TestGuardConnReleaseEndsWhatWasLeftOpen(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			other := s.open(t)
			name := testdb.UniqueName(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := newPinned(t, db, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := guardConn(g)
			tx, err := c.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			stmt, err := tx.PrepareContext(ctx, "SELECT 1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			txRows, err := tx.QueryContext(ctx, "SELECT v FROM "+table)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release with a transaction open on Guard.Conn: %v", err)
			}
			var n int
			if err := other.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows written by the transaction left open: %d, %v; want 0 (rolled back)", n, err)
			}
			if err := tx.Commit(); err == nil {
				t.Fatal("Commit after Release succeeded")
			}
			if txRows.Next() {
				t.Fatal("rows of the transaction left open still read after Release")
			}
			if _, err := stmt.ExecContext(ctx); err == nil {
				t.Fatal("a statement prepared on Guard.Conn's transaction ran after Release")
			}
			if g, err := newPinned(t, other, name).TryLock(ctx); err != nil {
				t.Fatalf("TryLock after Release: %v", err)
			} else {
				mustRelease(t, g)
			}
			for _, c := range []advisorylock.Conn{c, guardConn(g)} {
				if _, err := c.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrConnDone) {
					t.Fatalf("ExecContext on Guard.Conn after Release = %v, want sql.ErrConnDone", err)
				}
				var one int
				if err := c.QueryRowContext(ctx, "SELECT 1").Scan(&one); !errors.Is(err, sql.ErrConnDone) {
					t.Fatalf("QueryRowContext on Guard.Conn after Release = %v, want sql.ErrConnDone", err)
				}
				if _, err := c.BeginTx(ctx, nil); !errors.Is(err, sql.ErrConnDone) {
					t.Fatalf("BeginTx on Guard.Conn after Release = %v, want sql.ErrConnDone", err)
				}
			}
			if err := db.PingContext(ctx); err != nil {
				t.Fatalf("the pool after Release: %v", err)
			}
			if st := db.Stats(); st.InUse != 0 {
				t.Fatalf("after Release: InUse = %d, want 0", st.InUse)
			}
		})
	}
}

// TestGuardConnIsNilWithoutAPinnedConnection: a Lock on SQLite is a row
// and pins no connection: the deprecated Guard.Conn is nil.
func TestGuardConnIsNilWithoutAPinnedConnection(t *testing.T) {
	t.Parallel()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	g, err := newPinned(t, db, testdb.UniqueName(t)).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	if c := guardConn(g); c != nil {
		t.Fatalf("Guard.Conn on SQLite = %v, want nil", c)
	}
}

// TestGuardConnStepsTheKeepAliveAside: once the deprecated Guard.Conn was
// called, the lock's keep-alive sends no check for the rest of the hold,
// whether rows are open on the Conn or nothing is, while another guard's
// keep-alive at the same interval checks three times (the clock); the
// rows read to the end, and the lock is not lost.
func TestGuardConnStepsTheKeepAliveAside(t *testing.T) {
	const keepAlive = 20 * time.Millisecond
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			conn, clock := testdb.UniqueName(t)+"-conn", testdb.UniqueName(t)+"-clock"
			var connChecks, clockChecks atomic.Int64
			db := testdb.OpenHooked(t, drv, testdb.PostgresDSN(t), testdb.Hooks{Before: func(q string, _ []any) {
				switch {
				case strings.Contains(q, pgKeyWhere(conn)):
					connChecks.Add(1)
				case strings.Contains(q, pgKeyWhere(clock)):
					clockChecks.Add(1)
				}
			}})
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			take := func(name string) *advisorylock.Guard {
				g, err := newPinned(t, db, name, advisorylock.WithKeepAlive(keepAlive), quiet).TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { mustRelease(t, g) })
				return g
			}
			g, clockGuard := take(conn), take(clock)
			before := connChecks.Load()
			testdb.WaitFor(t, wait, func() bool { return connChecks.Load() > before }, "a keep-alive check before Guard.Conn")
			c := guardConn(g) // a check in flight ends first
			rows, err := c.QueryContext(ctx, "SELECT generate_series(1, 3)")
			if err != nil {
				t.Fatal(err)
			}
			if !rows.Next() {
				t.Fatalf("no rows: %v", rows.Err())
			}
			checked := connChecks.Load()
			intervals := func(what string) {
				t.Helper()
				from := clockChecks.Load()
				testdb.WaitFor(t, wait, func() bool { return clockChecks.Load() >= from+3 }, "three keep-alive intervals")
				if n := connChecks.Load() - checked; n != 0 {
					t.Fatalf("the keep-alive checked %d times over three intervals %s", n, what)
				}
			}
			intervals("with rows open on Guard.Conn")
			n := 1
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil || n != 3 {
				t.Fatalf("read %d rows open over keep-alive intervals, %v; want 3", n, err)
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			intervals("after Guard.Conn's rows were closed")
			for i, g := range []*advisorylock.Guard{g, clockGuard} {
				select {
				case <-g.Lost():
					t.Fatalf("guard %d of 2 lost", i+1)
				default:
				}
			}
		})
	}
}

// pgKeyWhere is the part of a statement that names name's key in
// pg_locks, as the keep-alive's check does.
func pgKeyWhere(name string) string {
	k := uint64(advisorylock.Key(name))
	return fmt.Sprintf("l.classid = %d AND l.objid = %d", k>>32, k&0xffffffff)
}

// TestGuardConnAndWithConnShareOneLending: WithConn on a Guard whose
// deprecated Conn was called runs fn on the same session, and the
// transaction fn leaves open stays open (Commit works after fn) until
// Release; Guard.Conn called inside WithConn's fn keeps fn's rows open
// past fn, until Release.
func TestGuardConnAndWithConnShareOneLending(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			s := connServers[0]
			table := scratchTable(t, db, s)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			pid := func(c advisorylock.Conn) (pid int) {
				t.Helper()
				if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Fatal(err)
				}
				return pid
			}

			g, err := newPinned(t, db, testdb.UniqueName(t)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := guardConn(g)
			var tx *sql.Tx
			err = g.WithConn(ctx, func(conn advisorylock.Conn) (err error) {
				if got, want := pid(conn), pid(c); got != want {
					return fmt.Errorf("WithConn's session %d, Guard.Conn's %d; want one", got, want)
				}
				if tx, err = conn.BeginTx(ctx, nil); err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)")
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("Commit after WithConn on Guard.Conn's lending: %v, want it open until Release", err)
			}
			mustRelease(t, g)

			g, err = newPinned(t, db, testdb.UniqueName(t)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var rows *sql.Rows
			err = g.WithConn(ctx, func(conn advisorylock.Conn) (err error) {
				if rows, err = conn.QueryContext(ctx, "SELECT generate_series(1, 3)"); err != nil {
					return err
				}
				c = guardConn(g)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil || n != 3 {
				t.Fatalf("rows of fn that called Guard.Conn, read after fn: %d, %v; want 3", n, err)
			}
			pid(c)
			mustRelease(t, g)
			if _, err := c.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrConnDone) {
				t.Fatalf("Guard.Conn after Release = %v, want sql.ErrConnDone", err)
			}
		})
	}
}

// TestForgottenGuardConnIsCleanedUp: a Guard reachable only through its
// deprecated Conn is not cleaned up while the Conn is kept (its
// statements keep running on the lock's session); once both are dropped
// without Release, it is: the connection is discarded and the lock freed.
func TestForgottenGuardConnIsCleanedUp(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			name := testdb.UniqueName(t)
			var logs syncBuffer
			l := newPinned(t, db, name, advisorylock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			ctx := context.Background()
			func() {
				g, err := l.TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				c := guardConn(g)
				for i := 0; i < 20; i++ {
					runtime.GC()
					var holds bool
					if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
						t.Fatalf("statement %d on Guard.Conn, with the Guard reachable only through it: holds %v, %v; want true", i, holds, err)
					}
				}
				if strings.Contains(logs.String(), "never released") {
					t.Fatal("the Guard was cleaned up while its Conn was kept")
				}
			}()
			other := newPinned(t, s.open(t), name)
			testdb.WaitFor(t, wait, func() bool {
				runtime.GC()
				g, err := other.TryLock(ctx)
				if err != nil {
					return false
				}
				mustRelease(t, g)
				return db.Stats().InUse == 0
			}, "a forgotten guard kept its lock or connection after its Conn was dropped")
		})
	}
}
