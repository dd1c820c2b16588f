package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// connServer is a server whose Lock pins a connection, as Guard.Conn's
// tests see it.
type connServer struct {
	name string
	open func(t *testing.T) *sql.DB
	// sessionHolds reports whether the session running the statements
	// on c holds the lock named name.
	holdsQuery func(name string) string
	// table DDL of a table the test writes to, with %s for its name.
	table string
	// Statements: one that runs for a second, one that returns 100000
	// rows, one that fails, the session's id, and (with %d for an id)
	// one that ends another session.
	sleep, rows, fail, pid, kill string
}

var (
	pgStatements = []string{"SELECT pg_sleep(1)", "SELECT generate_series(1, 100000)", "SELECT 1/0", "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(%d)"}
	myStatements = []string{"SELECT SLEEP(1)", "SELECT seq FROM seq_1_to_100000", "SELECT * FROM no_such_table_guardconn", "SELECT CONNECTION_ID()", "KILL %d"}
)

var connServers = []connServer{
	withStatements(connServer{name: "postgres/lib-pq", open: func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, "postgres") },
		holdsQuery: pgHoldsQuery, table: "CREATE TABLE %s (v int)"}, pgStatements),
	withStatements(connServer{name: "postgres/pgx", open: func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, "pgx") },
		holdsQuery: pgHoldsQuery, table: "CREATE TABLE %s (v int)"}, pgStatements),
	withStatements(connServer{name: "mysql", open: func(t *testing.T) *sql.DB { return testdb.OpenMySQL(t) },
		holdsQuery: func(name string) string {
			return fmt.Sprintf("SELECT IS_USED_LOCK('%s') = CONNECTION_ID()", mysqlLockName(name))
		}, table: "CREATE TABLE %s (v int) ENGINE=InnoDB"}, myStatements),
}

func withStatements(s connServer, st []string) connServer {
	s.sleep, s.rows, s.fail, s.pid, s.kill = st[0], st[1], st[2], st[3], st[4]
	return s
}

func pgHoldsQuery(name string) string {
	k := uint64(advisorylock.Key(name))
	return fmt.Sprintf(`SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
		AND classid = %d AND objid = %d AND objsubid = 1)`, k>>32, k&0xffffffff)
}

// scratchTable creates a table for one test and drops it at cleanup.
func scratchTable(t *testing.T, db *sql.DB, s connServer) string {
	t.Helper()
	table := "guardconn_" + strings.ReplaceAll(fmt.Sprint(time.Now().UnixNano()), "-", "")
	if _, err := db.Exec(fmt.Sprintf(s.table, table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + table) })
	return table
}

// TestGuardConnRunsQueriesInsideDoOnAPoolOfOne: with SetMaxOpenConns(1),
// where a statement on the pool inside Do waits forever for the one
// connection the lock pins, every kind of statement runs on Guard.Conn,
// on the session that holds the lock.
func TestGuardConnRunsQueriesInsideDoOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			db.SetMaxOpenConns(1)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			err := l.Do(ctx, func(ctx context.Context) error {
				c := advisorylock.GuardFromContext(ctx).Conn()
				if c == nil {
					return errors.New("Guard.Conn() = nil for a lock that pins a connection")
				}
				var holds bool
				if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
					return fmt.Errorf("the session of Guard.Conn holds the lock: %v, %v; want true", holds, err)
				}
				if _, err := c.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
					return fmt.Errorf("ExecContext: %w", err)
				}
				stmt, err := c.PrepareContext(ctx, "INSERT INTO "+table+" VALUES (2)")
				if err != nil {
					return fmt.Errorf("PrepareContext: %w", err)
				}
				if _, err := stmt.ExecContext(ctx); err != nil {
					return fmt.Errorf("Stmt.ExecContext: %w", err)
				}
				if err := stmt.Close(); err != nil {
					return fmt.Errorf("Stmt.Close: %w", err)
				}
				tx, err := c.BeginTx(ctx, nil)
				if err != nil {
					return fmt.Errorf("BeginTx: %w", err)
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (3)"); err != nil {
					return fmt.Errorf("Tx.ExecContext: %w", err)
				}
				if err := tx.Commit(); err != nil {
					return fmt.Errorf("Commit: %w", err)
				}
				rows, err := c.QueryContext(ctx, "SELECT v FROM "+table+" ORDER BY v")
				if err != nil {
					return fmt.Errorf("QueryContext: %w", err)
				}
				defer rows.Close()
				var got []int
				for rows.Next() {
					var v int
					if err := rows.Scan(&v); err != nil {
						return err
					}
					got = append(got, v)
				}
				if err := rows.Err(); err != nil || fmt.Sprint(got) != "[1 2 3]" {
					return fmt.Errorf("rows %v, %v; want [1 2 3]", got, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if s := db.Stats(); s.InUse != 0 {
				t.Fatalf("after Do: InUse = %d, want 0", s.InUse)
			}
		})
	}
}

// TestGuardConnIsNilWithoutAPinnedConnection: a Lock on SQLite is a row
// and pins no connection; GuardFromContext is nil outside Do.
func TestGuardConnIsNilWithoutAPinnedConnection(t *testing.T) {
	t.Parallel()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	g, err := newLock(t, db, testdb.UniqueName(t)).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	if c := g.Conn(); c != nil {
		t.Fatalf("Guard.Conn() on SQLite = %v, want nil", c)
	}
	if g := advisorylock.GuardFromContext(context.Background()); g != nil {
		t.Fatalf("GuardFromContext outside Do = %v, want nil", g)
	}
}

// TestGuardConnSharesTheConnectionWithTheKeepAlive: with a keep-alive
// every 20ms, a statement that runs for a second, rows left open and a
// transaction left open (in which a statement failed: 25P02 on
// PostgreSQL) on Guard.Conn for many intervals cost no false loss and no
// error of the user's; once the connection is free again the keep-alive
// still finds a real loss.
func TestGuardConnSharesTheConnectionWithTheKeepAlive(t *testing.T) {
	testdb.Slow(t, "statements of a second under a keep-alive, per server")
	const keepAlive = 20 * time.Millisecond
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			db.SetMaxOpenConns(1)
			l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithKeepAlive(keepAlive), quiet)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Release(ctx)
			c := g.Conn()
			notLost := func(what string) {
				t.Helper()
				select {
				case <-g.Lost():
					t.Fatalf("lost while %s on Guard.Conn", what)
				default:
				}
			}

			if _, err := c.ExecContext(ctx, s.sleep); err != nil {
				t.Fatalf("a long statement: %v", err)
			}
			notLost("a long statement ran")

			rows, err := c.QueryContext(ctx, s.rows)
			if err != nil {
				t.Fatal(err)
			}
			rows.Next()
			time.Sleep(20 * keepAlive) // rows open over many keep-alive intervals
			n := 1
			for rows.Next() {
				n++
			}
			if err := rows.Err(); err != nil || n != 100000 {
				t.Fatalf("read %d rows with open rows over keep-alives: %v", n, err)
			}
			notLost("rows were open")

			tx, err := c.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, s.fail); err == nil {
				t.Fatalf("%s did not fail", s.fail)
			}
			time.Sleep(20 * keepAlive) // a (failed) transaction open over many intervals
			if err := tx.Rollback(); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			notLost("a transaction was open")

			// The connection is free again: the keep-alive runs, and a
			// real loss is found.
			var pid int64
			if err := c.QueryRowContext(ctx, s.pid).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if _, err := s.open(t).Exec(fmt.Sprintf(s.kill, pid)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-g.Lost():
			case <-ctx.Done():
				t.Fatal("Lost() did not close after the session was ended")
			}
			if _, err := c.ExecContext(ctx, "SELECT 1"); err == nil {
				t.Fatal("a statement on Guard.Conn of a lost lock succeeded")
			}
		})
	}
}

// TestGuardConnLeftOpenAtReleaseIsRolledBack: a transaction left open on
// Guard.Conn at Release is rolled back before the unlock (its write is
// not kept) and rows left open are closed; the lock is free, the pool's
// connection is back and usable, and statements on Conn fail afterwards.
func TestGuardConnLeftOpenAtReleaseIsRolledBack(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			other := s.open(t)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := g.Conn()
			tx, err := c.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			rows, err := tx.QueryContext(ctx, "SELECT v FROM "+table)
			if err != nil {
				t.Fatal(err)
			}
			mustRelease(t, g)
			if _, err := newLock(t, other, name).TryLock(ctx); err != nil {
				t.Fatalf("TryLock after Release: %v", err)
			}
			var n int
			if err := other.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows written by the transaction left open: %d, %v; want 0 (rolled back)", n, err)
			}
			if rows.Next() {
				t.Fatal("rows left open at Release still read")
			}
			if err := tx.Commit(); err == nil {
				t.Fatal("Commit after Release succeeded")
			}
			if _, err := c.ExecContext(ctx, "SELECT 1"); err == nil {
				t.Fatal("a statement on Guard.Conn after Release succeeded")
			}
			if g.Conn() == nil {
				t.Fatal("Guard.Conn() after Release = nil, want a Conn whose statements fail")
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

// TestReleaseWhileAStatementRunsOnGuardConn: Release gives a statement in
// flight on Guard.Conn the release timeout to end, then cancels it and
// discards the connection, which frees the lock at once; the statement
// fails.
func TestReleaseWhileAStatementRunsOnGuardConn(t *testing.T) {
	const releaseTimeout = 300 * time.Millisecond
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name, advisorylock.WithReleaseTimeout(releaseTimeout))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := g.Conn()
			var pid int
			if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() {
				_, err := c.ExecContext(ctx, "SELECT pg_sleep(60)")
				ran <- err
			}()
			admin := testdb.OpenPostgres(t, "pgx")
			testdb.WaitFor(t, wait, func() bool {
				var running bool
				err := admin.QueryRow("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep(60)%' AND state = 'active')", pid).Scan(&running)
				return err == nil && running
			}, "the statement to run")
			start := time.Now()
			if err := g.Release(context.Background()); err != nil {
				t.Fatalf("Release while a statement ran: %v", err)
			}
			if took := time.Since(start); took > releaseTimeout+timeoutSlack {
				t.Fatalf("Release took %v with a release timeout of %v", took, releaseTimeout)
			}
			if err := <-ran; err == nil {
				t.Fatal("the statement running at Release succeeded")
			}
			testdb.WaitFor(t, wait, func() bool {
				g, err := newLock(t, admin, name).TryLock(ctx)
				if err == nil {
					mustRelease(t, g)
				}
				return err == nil
			}, "the lock to be free")
		})
	}
}

// TestForgottenGuardWithConnIsCleanedUp: a Guard dropped without Release,
// with a transaction left open on its Conn, is cleaned up: the connection
// is discarded (the transaction's write is not kept) and the lock freed.
func TestForgottenGuardWithConnIsCleanedUp(t *testing.T) {
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name, quiet)
			txCtx, endTx := context.WithCancel(context.Background())
			defer endTx() // ends database/sql's watch of the dropped transaction
			func() {
				g, err := l.TryLock(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				tx, err := g.Conn().BeginTx(txCtx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec("INSERT INTO " + table + " VALUES (1)"); err != nil {
					t.Fatal(err)
				}
			}()
			other := newLock(t, s.open(t), name)
			testdb.WaitFor(t, wait, func() bool {
				runtime.GC()
				g, err := other.TryLock(context.Background())
				if err != nil {
					return false
				}
				mustRelease(t, g)
				return db.Stats().InUse == 0
			}, "a forgotten guard with a Conn in use kept its lock or connection")
			var n int
			if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows written by the forgotten guard's transaction: %d, %v; want 0", n, err)
			}
		})
	}
}

// TestReleaseWhileAStatementThatCannotBeCancelledRuns: a statement on
// Guard.Conn whose context cannot end is not cut short: Release returns an
// error after the release timeout, and the lock is freed when the
// statement returns (its connection discarded).
func TestReleaseWhileAStatementThatCannotBeCancelledRuns(t *testing.T) {
	testdb.Slow(t, "waits out statements of seconds")
	const releaseTimeout = 300 * time.Millisecond
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name, advisorylock.WithReleaseTimeout(releaseTimeout), quiet)
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			c := g.Conn()
			var pid int
			if err := c.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			go func() {
				_, err := c.ExecContext(context.Background(), "SELECT pg_sleep(2)")
				ran <- err
			}()
			admin := testdb.OpenPostgres(t, "pgx")
			testdb.WaitFor(t, wait, func() bool {
				var running bool
				err := admin.QueryRow("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep(2)%' AND state = 'active')", pid).Scan(&running)
				return err == nil && running
			}, "the statement to run")
			if err := g.Release(context.Background()); err == nil {
				t.Fatal("Release while a statement that cannot be cancelled ran = nil, want an error")
			}
			if err := <-ran; err != nil {
				t.Fatalf("the statement: %v; want it to run to its end", err)
			}
			testdb.WaitFor(t, wait, func() bool {
				g, err := newLock(t, admin, name).TryLock(context.Background())
				if err == nil {
					mustRelease(t, g)
				}
				return err == nil
			}, "the lock to be free once the statement returned")
			testdb.WaitFor(t, wait, func() bool { return db.Stats().InUse == 0 }, "the connection to be discarded")
		})
	}
}
