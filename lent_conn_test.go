package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// connServer is a server whose Lock pins a connection, as WithConn's
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

// TestWithConnRunsQueriesInsideDoOnAPoolOfOne: with SetMaxOpenConns(1),
// where a statement on the pool inside Do waits forever for the one
// connection the lock pins, every kind of statement runs on WithConn's
// Conn, on the session that holds the lock.
func TestWithConnRunsQueriesInsideDoOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			db.SetMaxOpenConns(1)
			name := testdb.UniqueName(t)
			l := newPinned(t, db, name)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			err := l.Do(ctx, func(ctx context.Context) error {
				return advisorylock.GuardFromContext(ctx).WithConn(ctx, func(c advisorylock.Conn) error {
					var holds bool
					if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
						return fmt.Errorf("the session of WithConn's Conn holds the lock: %v, %v; want true", holds, err)
					}
					if _, err := c.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
						return fmt.Errorf("ExecContext: %w", err)
					}
					tx, err := c.BeginTx(ctx, nil)
					if err != nil {
						return fmt.Errorf("BeginTx: %w", err)
					}
					stmt, err := tx.PrepareContext(ctx, "INSERT INTO "+table+" VALUES (2)")
					if err != nil {
						return fmt.Errorf("Tx.PrepareContext: %w", err)
					}
					if _, err := stmt.ExecContext(ctx); err != nil {
						return fmt.Errorf("Stmt.ExecContext: %w", err)
					}
					if err := stmt.Close(); err != nil {
						return fmt.Errorf("Stmt.Close: %w", err)
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

// TestWithConnFailsWithoutAPinnedConnection: a Lock on SQLite is a row
// and pins no connection: WithConn returns an error without calling fn;
// GuardFromContext is nil outside Do.
func TestWithConnFailsWithoutAPinnedConnection(t *testing.T) {
	t.Parallel()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	g, err := newPinned(t, db, testdb.UniqueName(t)).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	called := false
	if err := g.WithConn(context.Background(), func(advisorylock.Conn) error { called = true; return nil }); err == nil || called {
		t.Fatalf("WithConn on SQLite = %v, fn called %v; want an error, fn not called", err, called)
	}
	if g := advisorylock.GuardFromContext(context.Background()); g != nil {
		t.Fatalf("GuardFromContext outside Do = %v, want nil", g)
	}
}

// TestWithConnStepsTheKeepAliveAside: with a keep-alive every 20ms, a
// statement that runs for a second, rows left open and a transaction left
// open (in which a statement failed: 25P02 on PostgreSQL) in one WithConn
// for many intervals cost no false loss and no error of the user's; once
// fn has returned the keep-alive still finds a real loss, and WithConn
// then refuses.
func TestWithConnStepsTheKeepAliveAside(t *testing.T) {
	testdb.Slow(t, "statements of a second under a keep-alive, per server")
	t.Parallel() // names and sessions of its own; it ends only its own
	const keepAlive = 20 * time.Millisecond
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel() // a name and sessions of its own on each server
			db := s.open(t)
			db.SetMaxOpenConns(1)
			l := newPinned(t, db, testdb.UniqueName(t), advisorylock.WithKeepAlive(keepAlive), quiet)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Release(ctx)
			notLost := func(what string) error {
				select {
				case <-g.Lost():
					return fmt.Errorf("lost while %s in WithConn", what)
				default:
					return nil
				}
			}
			var pid int64
			err = g.WithConn(ctx, func(c advisorylock.Conn) error {
				if _, err := c.ExecContext(ctx, s.sleep); err != nil {
					return fmt.Errorf("a long statement: %w", err)
				}
				if err := notLost("a long statement ran"); err != nil {
					return err
				}
				rows, err := c.QueryContext(ctx, s.rows)
				if err != nil {
					return err
				}
				rows.Next()
				time.Sleep(20 * keepAlive) // rows open over many keep-alive intervals
				n := 1
				for rows.Next() {
					n++
				}
				if err := rows.Err(); err != nil || n != 100000 {
					return fmt.Errorf("read %d rows with open rows over keep-alives: %v", n, err)
				}
				if err := notLost("rows were open"); err != nil {
					return err
				}
				tx, err := c.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, s.fail); err == nil {
					return fmt.Errorf("%s did not fail", s.fail)
				}
				time.Sleep(20 * keepAlive) // a (failed) transaction open over many intervals
				if err := tx.Rollback(); err != nil {
					return fmt.Errorf("Rollback: %w", err)
				}
				if err := notLost("a transaction was open"); err != nil {
					return err
				}
				return c.QueryRowContext(ctx, s.pid).Scan(&pid)
			})
			if err != nil {
				t.Fatal(err)
			}

			// fn has returned: the keep-alive runs, and a real loss is
			// found.
			if _, err := s.open(t).Exec(fmt.Sprintf(s.kill, pid)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-g.Lost():
			case <-ctx.Done():
				t.Fatal("Lost() did not close after the session was ended")
			}
			called := false
			if err := g.WithConn(ctx, func(advisorylock.Conn) error { called = true; return nil }); !errors.Is(err, advisorylock.ErrLockLost) || called {
				t.Fatalf("WithConn of a lost lock = %v, fn called %v; want ErrLockLost, fn not called", err, called)
			}
		})
	}
}

// TestWithConnEndsWhatFnLeftOpen: when fn returns, the transaction it
// left open is rolled back (its write is not kept, the statement
// prepared on it is closed), its rows are closed, and the Conn it kept fails with sql.ErrConnDone;
// the lock stays held on a usable session, and Release frees it and
// gives the connection back to the pool.
func TestWithConnEndsWhatFnLeftOpen(t *testing.T) {
	t.Parallel()
	for _, s := range connServers {
		t.Run(s.name, func(t *testing.T) {
			db := s.open(t)
			table := scratchTable(t, db, s)
			other := s.open(t)
			name := testdb.UniqueName(t)
			l := newPinned(t, db, name)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var (
				kept   advisorylock.Conn
				tx     *sql.Tx
				txRows *sql.Rows
				rows   *sql.Rows
				stmt   *sql.Stmt
			)
			err = g.WithConn(ctx, func(c advisorylock.Conn) (err error) {
				kept = c
				if rows, err = c.QueryContext(ctx, s.rows); err != nil {
					return err
				}
				if !rows.Next() {
					return fmt.Errorf("no rows: %v", rows.Err())
				}
				if err := rows.Close(); err != nil { // one statement at a time: rows first
					return err
				}
				if rows, err = c.QueryContext(ctx, "SELECT 1"); err != nil {
					return err
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if rows.Next() {
				t.Fatal("rows left open by fn still read after WithConn")
			}
			err = g.WithConn(ctx, func(c advisorylock.Conn) (err error) {
				if tx, err = c.BeginTx(ctx, nil); err != nil {
					return err
				}
				if stmt, err = tx.PrepareContext(ctx, "SELECT 1"); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
					return err
				}
				txRows, err = tx.QueryContext(ctx, "SELECT v FROM "+table)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err == nil {
				t.Fatal("Commit after WithConn succeeded")
			}
			if _, err := stmt.ExecContext(ctx); err == nil {
				t.Fatal("a statement prepared in fn ran after WithConn")
			}
			var n int
			if err := other.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
				t.Fatalf("rows written by the transaction fn left open: %d, %v; want 0 (rolled back)", n, err)
			}
			if txRows.Next() {
				t.Fatal("rows of the transaction fn left open still read")
			}
			if _, err := kept.ExecContext(ctx, "SELECT 1"); !errors.Is(err, sql.ErrConnDone) {
				t.Fatalf("a statement on the Conn kept past fn = %v, want sql.ErrConnDone", err)
			}
			var one int
			if err := kept.QueryRowContext(ctx, "SELECT 1").Scan(&one); !errors.Is(err, sql.ErrConnDone) {
				t.Fatalf("a row on the Conn kept past fn = %v, want sql.ErrConnDone", err)
			}
			err = g.WithConn(ctx, func(c advisorylock.Conn) error {
				var holds bool
				if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
					return fmt.Errorf("the session still holds the lock: %v, %v; want true", holds, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			mustRelease(t, g)
			if _, err := newPinned(t, other, name).TryLock(ctx); err != nil {
				t.Fatalf("TryLock after Release: %v", err)
			}
			if err := g.WithConn(ctx, func(advisorylock.Conn) error { return nil }); !errors.Is(err, advisorylock.ErrLockLost) {
				t.Fatalf("WithConn after Release = %v, want ErrLockLost", err)
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

// lenders lend a Guard's connection to fn: WithConn, and the deprecated
// Guard.Conn (until the release), on which fn runs at once.
var lenders = []struct {
	name string
	lend func(ctx context.Context, g *advisorylock.Guard, fn func(advisorylock.Conn) error) error
}{
	{"WithConn", func(ctx context.Context, g *advisorylock.Guard, fn func(advisorylock.Conn) error) error {
		return g.WithConn(ctx, fn)
	}},
	{"Conn", func(_ context.Context, g *advisorylock.Guard, fn func(advisorylock.Conn) error) error {
		return fn(guardConn(g))
	}},
}

// TestReleaseWhileWithConnRunsAStatement: Release gives fn (or a
// statement on the deprecated Guard.Conn) the release timeout to return,
// then cancels its statement in flight and discards the connection,
// which frees the lock at once; the statement fails. The cases mostly
// wait, side by side (no other test beside them: the bound is tight).
func TestReleaseWhileWithConnRunsAStatement(t *testing.T) {
	const releaseTimeout = 300 * time.Millisecond
	for _, lender := range lenders {
		for _, drv := range testdb.Drivers {
			t.Run(lender.name+"/"+drv, func(t *testing.T) {
				t.Parallel()
				releaseWhileAStatementRuns(t, drv, releaseTimeout, lender.lend)
			})
		}
	}
}

func releaseWhileAStatementRuns(t *testing.T, drv string, releaseTimeout time.Duration, lend func(ctx context.Context, g *advisorylock.Guard, fn func(advisorylock.Conn) error) error) {
	db := testdb.OpenPostgres(t, drv)
	name := testdb.UniqueName(t)
	l := newPinned(t, db, name, advisorylock.WithReleaseTimeout(releaseTimeout))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pids := make(chan int, 1)
	ran := make(chan error, 1)
	go func() {
		var stmtErr error
		ran <- lend(ctx, g, func(c advisorylock.Conn) error {
			var pid int
			if err := c.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			_, stmtErr = c.ExecContext(context.Background(), "SELECT pg_sleep(60)")
			return nil
		})
		if stmtErr == nil {
			ran <- errors.New("the statement running at Release succeeded")
		}
		close(ran)
	}()
	var pid int
	select {
	case pid = <-pids:
	case err := <-ran:
		t.Fatal(err)
	}
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
	for err := range ran {
		if err != nil {
			t.Fatal(err)
		}
	}
	testdb.WaitFor(t, wait, func() bool {
		g, err := newPinned(t, admin, name).TryLock(ctx)
		if err == nil {
			mustRelease(t, g)
		}
		return err == nil
	}, "the lock to be free")
}

// TestReleaseWhileWithConnDoesNotReturn: fn that does not return even
// when its statements are cancelled keeps the connection: Release
// returns an error after the release timeout, fn's statements fail from
// then on, and the lock is freed (its connection discarded) when fn
// returns.
func TestReleaseWhileWithConnDoesNotReturn(t *testing.T) {
	t.Parallel() // names and pools of its own
	const releaseTimeout = 300 * time.Millisecond
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			admin := testdb.OpenPostgres(t, "pgx")
			name := testdb.UniqueName(t)
			l := newPinned(t, db, name, advisorylock.WithReleaseTimeout(releaseTimeout), quiet)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			inFn, released := make(chan struct{}), make(chan struct{})
			ran := make(chan error, 1)
			go func() {
				ran <- g.WithConn(ctx, func(c advisorylock.Conn) error {
					close(inFn)
					<-released // user code that outlasts the release
					if _, err := c.ExecContext(ctx, "SELECT 1"); err == nil {
						return errors.New("a statement in fn after Release gave up on it succeeded")
					}
					return nil
				})
			}()
			<-inFn
			start := time.Now()
			if err := g.Release(context.Background()); err == nil {
				t.Fatal("Release while fn did not return = nil, want an error")
			}
			if took := time.Since(start); took > releaseTimeout+timeoutSlack {
				t.Fatalf("Release took %v with a release timeout of %v", took, releaseTimeout)
			}
			if g, err := newPinned(t, admin, name).TryLock(ctx); err == nil {
				mustRelease(t, g)
				t.Fatal("the lock was free while fn still had its connection")
			}
			close(released)
			if err := <-ran; err != nil {
				t.Fatal(err)
			}
			testdb.WaitFor(t, wait, func() bool {
				g, err := newPinned(t, admin, name).TryLock(ctx)
				if err == nil {
					mustRelease(t, g)
				}
				return err == nil
			}, "the lock to be free once fn returned")
			testdb.WaitFor(t, wait, func() bool { return db.Stats().InUse == 0 }, "the connection to be discarded")
		})
	}
}

// TestForgottenGuardWithConnIsCleanedUp: a Guard reachable only through
// a running WithConn is not cleaned up under fn (its statements keep
// running on the lock's session); dropped after, without Release, it is:
// the connection is discarded and the lock freed.
func TestForgottenGuardWithConnIsCleanedUp(t *testing.T) {
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
				err = g.WithConn(ctx, func(c advisorylock.Conn) error {
					for i := 0; i < 20; i++ {
						runtime.GC()
						var holds bool
						if err := c.QueryRowContext(ctx, s.holdsQuery(name)).Scan(&holds); err != nil || !holds {
							return fmt.Errorf("statement %d in fn, with the Guard reachable only through WithConn: holds %v, %v; want true", i, holds, err)
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(logs.String(), "never released") {
					t.Fatal("the Guard was cleaned up while WithConn ran")
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
			}, "a forgotten guard kept its lock or connection after WithConn")
		})
	}
}

// pinned is the option of a Lock that pins one session per held lock
// (the default shares sessions: see WithMultiplexing).
var pinned = advisorylock.WithMultiplexing(0)

// sessionMode is a way for a Lock or Set to hold its session: shared
// with other holds (the default) or pinned to one hold.
type sessionMode struct {
	name string                // the subtest's name: "shared" or "pinned"
	opts []advisorylock.Option // what the Lock or Set is given for it
}

// sessionModes are the two ways to hold a session, for the tests that run
// both: a shared session's try, release and keep-alive are other code
// than a pinned one's.
func sessionModes() []sessionMode {
	return []sessionMode{{"shared", nil}, {"pinned", []advisorylock.Option{pinned}}}
}

// newPinned returns a Lock that pins one session per held lock: what the
// tests of a lock's own connection (WithConn, Guard.Conn) are about.
func newPinned(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	return newLock(t, db, name, append(opts, pinned)...)
}
