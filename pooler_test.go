package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

func TestPoolerHint(t *testing.T) {
	cases := []struct {
		dsn  string
		want string // "" for no hint
	}{
		// URL form.
		{"postgres://app:secret@db.internal:5432/app?sslmode=disable", ""},
		{"postgres://app@db.internal:6432/app", "pgbouncer"},
		{"postgresql://app@pgbouncer.svc.cluster.local/app", "pgbouncer"},
		{"postgres://app@MY-PGBOUNCER-1:5432/app", "pgbouncer"},
		{"postgres://app@db.internal/app?pgbouncer=true", "pgbouncer"},
		{"postgres://app@db.internal/app?pgbouncer=false", ""},
		{"postgres://app@db.internal:6543/app", "pooler"},
		{"postgres://app@myproxy.proxy-c0abcdefghij.us-east-1.rds.amazonaws.com:5432/app", "rds-proxy"},
		{"postgres://app@myproxy.proxy-c0abcdefghij.cn-north-1.rds.amazonaws.com.cn/app", "rds-proxy"},
		{"postgres://app@mydb.c0abcdefghij.us-east-1.rds.amazonaws.com:5432/app", ""},
		{"postgres://postgres.abcd:pw@aws-0-eu-central-1.pooler.supabase.com:6543/postgres", "supabase"},
		{"postgres://postgres.abcd:pw@aws-0-eu-central-1.pooler.supabase.com:5432/postgres", "supabase"},
		{"postgres://postgres:pw@db.abcdefgh.supabase.co:6543/postgres", "supabase"},
		{"postgres://postgres:pw@db.abcdefgh.supabase.co:5432/postgres", ""},
		{"postgres://u:p@ep-cool-darkness-123456-pooler.us-east-2.aws.neon.tech/neondb?sslmode=require", "neon"},
		{"postgres://u:p@ep-cool-darkness-123456.us-east-2.aws.neon.tech/neondb?sslmode=require", ""},
		{"postgres://u@billing-pooler.internal/app", "pooler"},
		{"postgres://u@[::1]:6432/app", "pgbouncer"},
		{"postgres://u@[::1]/app", ""},
		{"postgres://u@h1:5432,h2:6432/app", "pgbouncer"},
		{"postgres://u@h1:5432,h2:5433/app", ""},
		{"postgres:///app?host=%2Fvar%2Frun%2Fpgbouncer&port=5432", "pgbouncer"},
		{"postgres://u@db.internal/app?port=6432", "pgbouncer"},
		{"postgres:///app?port=6432", "pgbouncer"},
		{"POSTGRES://U@DB.INTERNAL:6432/APP", "pgbouncer"},
		// key=value form.
		{"host=db.internal port=5432 dbname=app", ""},
		{"host=db.internal port=6432 dbname=app", "pgbouncer"},
		{"host = db.internal  port = 6432", "pgbouncer"},
		{"host='pgbouncer.local' user=app", "pgbouncer"},
		{"host=db.internal dbname=app pgbouncer=true", "pgbouncer"},
		{"host=db.internal dbname=app pgbouncer=TRUE", "pgbouncer"},
		{"host=myproxy.proxy-c0abcdefghij.eu-west-1.rds.amazonaws.com user=app", "rds-proxy"},
		{"host=aws-0-us-east-1.pooler.supabase.com port=6543", "supabase"},
		{"host=ep-x-1-pooler.eu-central-1.aws.neon.tech", "neon"},
		{"host=h1,h2 port=5432,6543", "pooler"},
		{"host=h1,h2 port=6432", "pgbouncer"},
		{"port=6432 dbname=app", "pgbouncer"},
		{"dbname=app", ""},
		{"dbname='it''s' host=db port=5432", ""},
		{"password='has space 6432' host=db", ""},
		// Garbage and other databases.
		{"", ""},
		{"   ", ""},
		{"not a dsn", ""},
		{"postgres://", ""},
		{"postgres://[::1", ""},
		{"postgres://u@h:6432:x/app", ""},
		{"host='unterminated", ""},
		{"mysql://root@localhost:6432/app", ""},
		{"file:locks.db", ""},
		{"=6432", ""},
		{"postgres://%zz@pgbouncer/x?%zz=%zz", "pgbouncer"},
		// The poolers of docs/production.md, by the hosts and ports their
		// documentation gives.
		{"postgres://app@myproxy-ro.endpoint.proxy-c0abcdefghij.us-east-1.rds.amazonaws.com:5432/app", "rds-proxy"}, // an added proxy endpoint
		{"postgres://app@myproxy.endpoint.c0abcdefghij.us-east-1.rds.amazonaws.com/app", ""},
		{"postgres://app@pgdog.internal:6432/app", "pgdog"},
		{"host=pgdog port=5432", "pgdog"},
		{"postgres://app@db.internal:6133/app", "proxysql"}, // ProxySQL's PostgreSQL port
		{"postgres://app@proxysql.svc:5432/app", "proxysql"},
		{"postgres://app@db.internal:6033/app", ""}, // ProxySQL's MySQL port, in a PostgreSQL DSN
		{"postgresql://u:p@ep-x-1-pooler.eastus2.azure.neon.tech/neondb", "neon"},
		// go-sql-driver/mysql DSNs: RDS Proxy's and ProxySQL's signs only.
		{"app:secret@tcp(myproxy.proxy-c0abcdefghij.us-east-1.rds.amazonaws.com:3306)/app?parseTime=true", "rds-proxy"},
		{"app@tcp(reader.endpoint.proxy-c0abcdefghij.eu-west-1.rds.amazonaws.com:3306)/app", "rds-proxy"},
		{"app:secret@tcp(db.internal:6033)/app", "proxysql"},
		{"tcp(proxysql-0.proxysql:3306)/app", "proxysql"},
		{"app:s@cr(t@tcp(db.internal:6033)/app", "proxysql"}, // a password with "@" and "("
		{"app:secret@tcp(db.internal:3306)/app", ""},
		{"app:secret@tcp(db.internal:6432)/app", ""}, // PgBouncer's port means nothing to MySQL
		{"app@tcp(mydb.c0abcdefghij.us-east-1.rds.amazonaws.com:3306)/app", ""},
		{"host=db password=x@tcp(h:6033)/ port=5432", ""}, // key=value, not a MySQL DSN
		{"app@tcp(db.internal:6033", ""},
	}
	for _, c := range cases {
		got, ok := advisorylock.PoolerHint(c.dsn)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("PoolerHint(%q) = %q, %v; want %q, %v", c.dsn, got, ok, c.want, c.want != "")
		}
	}
}

// bouncerDSN configures a PgBouncer DSN for drv as the driver documents
// for a transaction pool without prepared statements: pgx in exec mode
// (QueryExecModeExec, which pgx prefers over simple_protocol); lib/pq
// needs nothing.
func bouncerDSN(drv, dsn string) string {
	if drv == "pgx" {
		return dsn + "&default_query_exec_mode=exec"
	}
	return dsn
}

// poolerDBs opens drv handles directly, through the session pool and
// through the transaction pool.
func poolerDBs(t *testing.T, drv string) (direct, session, tx *sql.DB) {
	t.Helper()
	txDSN, sessionDSN := testdb.PgBouncer(t)
	return testdb.OpenPostgres(t, drv),
		testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, sessionDSN)),
		testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, txDSN))
}

func detect(t *testing.T, db advisorylock.DB) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mode, err := advisorylock.DetectPooler(ctx, db)
	if err != nil {
		t.Fatalf("DetectPooler: %v", err)
	}
	return mode
}

func TestDetectPooler(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			direct, session, tx := poolerDBs(t, drv)
			for _, c := range []struct {
				name string
				db   advisorylock.DB
				want bool
			}{
				{"direct", direct, false},
				{"session pool", session, false},
				{"transaction pool", tx, true},
				{"transaction pool via an embedding handle (sqlx)", embed(tx, drv), true},
			} {
				if got := detect(t, c.db); got != c.want {
					t.Errorf("%s: DetectPooler = %v, want %v", c.name, got, c.want)
				}
			}
		})
	}
}

// TestDetectPoolerWithPgxCachedStatements: pgx left in its default mode
// (cached prepared statements) behind a transaction pool either sees the
// sessions switch or has its prepared statements go missing; both are
// multiplexing.
func TestDetectPoolerWithPgxCachedStatements(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	db := testdb.OpenPostgresDSN(t, "pgx", txDSN)
	if got := detect(t, db); got != true {
		t.Fatalf("DetectPooler = %v, want %v", got, true)
	}
}

// TestDetectPoolerOneConnection: with SetMaxOpenConns(1) the probe reads
// one connection twice instead of two at once, so it never waits for a
// second connection, and it still catches a transaction pool whose other
// clients move it between sessions.
func TestDetectPoolerOneConnection(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			direct, session, tx := poolerDBs(t, drv)
			for _, db := range []*sql.DB{direct, session, tx} {
				db.SetMaxOpenConns(1)
			}
			if got := detect(t, direct); got != false {
				t.Errorf("direct: DetectPooler = %v, want %v", got, false)
			}
			if got := detect(t, session); got != false {
				t.Errorf("session pool: DetectPooler = %v, want %v", got, false)
			}
			txDSN, _ := testdb.PgBouncer(t)
			stop := testdb.KeepBusy(t, drv, bouncerDSN(drv, txDSN), testdb.PgBouncerPoolSize+3)
			defer stop()
			if got := detect(t, tx); got != true {
				t.Errorf("busy transaction pool: DetectPooler = %v, want %v", got, true)
			}
		})
	}
}

// TestDetectPoolerDoesNotWaitForASecondConnection: when the pool cannot
// give the probe a second connection (here its other connection is held
// by the test), the probe gives up waiting and reads one connection.
func TestDetectPoolerDoesNotWaitForASecondConnection(t *testing.T) {
	testdb.Slow(t, "about a second on 2 CPUs")
	t.Parallel() // a pool of its own
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(2)
	ctx := context.Background()
	held, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	done := make(chan struct{})
	var mode bool
	go func() {
		defer close(done)
		mode, err = advisorylock.DetectPooler(ctx, db)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("DetectPooler still waiting for a second connection after a minute")
	}
	if err != nil || mode != false {
		t.Fatalf("DetectPooler = %v, %v; want %v, nil", mode, err, false)
	}
}

func TestDetectPoolerErrors(t *testing.T) {
	t.Run("no connection", func(t *testing.T) {
		db := testdb.OpenPostgres(t, "postgres")
		db.SetMaxOpenConns(1)
		held, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = advisorylock.DetectPooler(ctx, db)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "advisorylock: pooler probe: ") {
			t.Fatalf("DetectPooler on a pool whose only connection is held = %v, want the context's deadline, wrapped", err)
		}
	})
	t.Run("server gone", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		db, err := sql.Open("postgres", testdb.WithHostPort(testdb.PostgresDSN(t), addr))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = advisorylock.DetectPooler(ctx, db)
		var opErr *net.OpError
		if !errors.As(err, &opErr) || !strings.HasPrefix(err.Error(), "advisorylock: pooler probe: ") {
			t.Fatalf("DetectPooler with nothing listening = %v, want a wrapped *net.OpError", err)
		}
	})
	t.Run("nil db", func(t *testing.T) {
		var db *sql.DB
		if _, err := advisorylock.DetectPooler(context.Background(), db); !errors.Is(err, advisorylock.ErrUnsupported) {
			t.Fatalf("DetectPooler(nil) = %v, want ErrUnsupported", err)
		}
	})
	t.Run("sqlite has no sessions to multiplex", func(t *testing.T) {
		db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
		if mode, err := advisorylock.DetectPooler(context.Background(), db); err != nil || mode != false {
			t.Fatalf("DetectPooler(sqlite) = %v, %v; want %v, nil", mode, err, false)
		}
	})
}

func TestNewRefusesTransactionPooler(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			_, _, tx := poolerDBs(t, drv)
			name := testdb.UniqueName(t)
			errs := make([]error, 16)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { _, errs[i] = newAndCheck(tx, name) })
			}
			wg.Wait()
			for _, err := range errs {
				if !errors.Is(err, advisorylock.ErrTransactionPooler) {
					t.Fatalf("New+Check through a transaction pool = %v, want ErrTransactionPooler", err)
				}
			}
			err := errs[0]
			if msg := err.Error(); !strings.Contains(msg, "LeaseLock") || !strings.Contains(msg, name) {
				t.Fatalf("error %q should name the lock and point to LeaseLock", msg)
			}
			// The verdict is kept for this *sql.DB, also when reached through a handle that embeds it (sqlx).
			if _, err := newAndCheck(embed(tx, drv), name); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("second New = %v, want ErrTransactionPooler", err)
			}
			// New itself does no I/O; the first operation refuses.
			l, err := advisorylock.New(tx, name)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("TryLock through a transaction pool = %v, want ErrTransactionPooler", err)
			}
			// Shared sessions and sets are session locks too.
			for what, mk := range map[string]func() (*advisorylock.Lock, error){
				"multiplexed": func() (*advisorylock.Lock, error) {
					return advisorylock.New(tx, name, advisorylock.WithMultiplexing(2))
				},
				"set": func() (*advisorylock.Lock, error) { return advisorylock.NewSet(tx, []string{name, name + "/2"}) },
			} {
				l, err := mk()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrTransactionPooler) {
					t.Fatalf("%s TryLock through a transaction pool = %v, want ErrTransactionPooler", what, err)
				}
			}
		})
	}
}

// TestNewWorksThroughSessionPool: a session pool pins one server session
// per client connection, so session locks work through it.
func TestNewWorksThroughSessionPool(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			direct, session, _ := poolerDBs(t, drv)
			name := testdb.UniqueName(t)
			l, err := advisorylock.New(session, name)
			if err != nil {
				t.Fatalf("New through a session pool: %v", err)
			}
			ctx := context.Background()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			t.Cleanup(func() { _ = g.Release(ctx) })
			key := advisorylock.Key(name)
			if n := testdb.AdvisoryLocks(t, direct, &key); n != 1 {
				t.Fatalf("%d server sessions hold the lock, want 1", n)
			}
			l2, err := advisorylock.New(session, name)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if _, err := l2.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock while held through the session pool = %v, want ErrNotAcquired", err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if n := testdb.AdvisoryLocks(t, direct, &key); n != 0 {
				t.Fatalf("%d locks left after Release", n)
			}
			g2, err := l2.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock after Release: %v", err)
			}
			if err := g2.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
		})
	}
}

func TestWithPoolerCheckFalseSkipsTheProbe(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			_, _, tx := poolerDBs(t, drv)
			counter := &countingLocker{SessionIdentifier: postgresLocker(t)}
			l, err := advisorylock.New(tx, testdb.UniqueName(t), advisorylock.WithBackend(counter), advisorylock.WithPoolerCheck(false))
			if err != nil || l == nil {
				t.Fatalf("New with WithPoolerCheck(false) through a transaction pool = %v, want a Lock", err)
			}
			if n := counter.identities.Load(); n != 0 {
				t.Fatalf("New read %d session identities with the check off, want 0", n)
			}
		})
	}
}

// countingLocker is the PostgreSQL backend, counting (and on demand
// failing) the probe's identity reads.
type countingLocker struct {
	backend.SessionIdentifier
	identities atomic.Int64
	fail       atomic.Pointer[error] // returned once by SessionIdentity, then cleared
}

func (c *countingLocker) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	c.identities.Add(1)
	if err := c.fail.Swap(nil); err != nil {
		return "", *err
	}
	return c.SessionIdentifier.SessionIdentity(ctx, conn)
}

func postgresLocker(t *testing.T) backend.SessionIdentifier {
	t.Helper()
	s, ok := advisorylock.Postgres().(backend.SessionIdentifier)
	if !ok {
		t.Fatal("Postgres() is not a SessionLocker")
	}
	return s
}

// TestNewProbesOncePerDB: many goroutines taking their first lock at once
// on one DB share one probe, and later ones reuse its verdict.
func TestNewProbesOncePerDB(t *testing.T) {
	newLocks := func(t *testing.T, db advisorylock.DB, c *countingLocker, n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				_, err := newAndCheck(db, testdb.UniqueName(t), advisorylock.WithBackend(c))
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("New: %v", err)
			}
		}
	}
	one := &countingLocker{SessionIdentifier: postgresLocker(t)}
	newLocks(t, testdb.OpenPostgres(t, "postgres"), one, 1)
	perProbe := one.identities.Load()
	if perProbe == 0 {
		t.Fatal("New read no session identity: no probe ran")
	}

	db := testdb.OpenPostgres(t, "postgres")
	many := &countingLocker{SessionIdentifier: postgresLocker(t)}
	newLocks(t, db, many, 32)
	if got := many.identities.Load(); got != perProbe {
		t.Fatalf("32 concurrent New calls read %d identities, one probe reads %d", got, perProbe)
	}
	newLocks(t, db, many, 4)
	newLocks(t, embed(db, "postgres"), many, 4)
	if got := many.identities.Load(); got != perProbe {
		t.Fatalf("later New calls probed again: %d identities read, want %d", got, perProbe)
	}
}

// TestNewDoesNotKeepAFailedProbe: a probe that fails fails the first
// operation, and the next one probes again.
func TestNewDoesNotKeepAFailedProbe(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	c := &countingLocker{SessionIdentifier: postgresLocker(t)}
	boom := errors.New("injected identity failure")
	c.fail.Store(&boom)
	_, err := newAndCheck(db, testdb.UniqueName(t), advisorylock.WithBackend(c))
	if !errors.Is(err, boom) {
		t.Fatalf("New with a failing probe = %v, want the probe's error", err)
	}
	if _, err := newAndCheck(db, testdb.UniqueName(t), advisorylock.WithBackend(c)); err != nil {
		t.Fatalf("New after a failed probe: %v", err)
	}
	after := c.identities.Load()
	if _, err := newAndCheck(db, testdb.UniqueName(t), advisorylock.WithBackend(c)); err != nil {
		t.Fatalf("New: %v", err)
	}
	if got := c.identities.Load(); got != after {
		t.Fatalf("a successful probe was not kept: %d identities read, then %d", after, got)
	}
}

// TestNewOnOneConnectionPool: the probe needs only one connection, so New
// and a lock work on a pool limited to one.
func TestNewOnOneConnectionPool(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(1)
			done := make(chan error, 1)
			go func() {
				l, err := advisorylock.New(db, testdb.UniqueName(t))
				if err == nil {
					var g *advisorylock.Guard
					if g, err = l.TryLock(context.Background()); err == nil {
						err = g.Release(context.Background())
					}
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(time.Minute):
				t.Fatal("New on a one-connection pool still running after a minute")
			}
		})
	}
}

// TestReleaseOnAnotherServerSessionIsTransactionPooler: with the probe
// off, a Lock taken through a transaction pool is released on whatever
// server session the pooler picks. The test makes sure it is another one
// by keeping the acquiring session busy in a transaction of another
// client; Release must then report ErrTransactionPooler. The lock left on
// the acquiring session is freed from inside that transaction. In the
// "name taken" case the other server sessions already have a statement
// of the name lib/pq gives the unlock ("1", another client's): its
// prepare then fails (SQLSTATE 42P05), which is a sign of the pooler too.
func TestReleaseOnAnotherServerSessionIsTransactionPooler(t *testing.T) {
	cases := []struct {
		name, drv string
		taken     bool
	}{{"postgres", "postgres", false}, {"pgx", "pgx", false}, {"postgres/name-taken", "postgres", true}}
	for _, c := range cases {
		drv := c.drv
		t.Run(c.name, func(t *testing.T) {
			txDSN, _ := testdb.PgBouncer(t)
			direct := testdb.OpenPostgres(t, "postgres")
			tx := testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, txDSN))
			name := testdb.UniqueName(t)
			key := advisorylock.Key(name)
			t.Cleanup(func() { terminateHolders(t, direct, key) })
			l, err := advisorylock.New(tx, name, advisorylock.WithPoolerCheck(false), advisorylock.WithKeepAlive(0))
			if err != nil {
				t.Fatalf("New with the check off: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock through the transaction pool: %v", err)
			}
			holder := holderPID(t, direct, key)
			pinned := pinServerSession(t, txDSN, holder)
			if c.taken {
				prepareOnFreeSessions(t, txDSN, `PREPARE "1" AS SELECT 1`)
			}

			err = g.Release(ctx)
			if !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Release on another server session = %v, want ErrTransactionPooler", err)
			}
			t.Logf("Release: %v", err)
			if n := testdb.AdvisoryLocks(t, direct, &key); n != 1 {
				t.Fatalf("%d sessions hold the lock, want the acquiring one still", n)
			}
			var freed bool
			if err := pinned.QueryRowContext(ctx, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", key)).Scan(&freed); err != nil || !freed {
				t.Fatalf("unlock on the acquiring session: %v, %v", freed, err)
			}
			if err := pinned.Rollback(); err != nil {
				t.Fatal(err)
			}
			if n := testdb.AdvisoryLocks(t, direct, &key); n != 0 {
				t.Fatalf("%d locks left behind", n)
			}
		})
	}
}

// prepareOnFreeSessions runs prepare on every server session of the
// transaction pool but the one pinned (PgBouncerPoolSize-1 transactions
// open at once, so each has a session of its own); a statement of that
// name already there (42P05) will do as well. Prepared statements outlive
// the transaction.
func prepareOnFreeSessions(t *testing.T, txDSN, prepare string) {
	t.Helper()
	db := testdb.OpenPostgresDSN(t, "postgres", txDSN)
	var txs []*sql.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback()
		}
	}()
	for range testdb.PgBouncerPoolSize - 1 {
		tx, err := db.Begin()
		if err != nil {
			t.Fatalf("BEGIN through the transaction pool: %v", err)
		}
		txs = append(txs, tx)
		var code interface{ SQLState() string }
		if _, err := tx.Exec(prepare); err != nil && !(errors.As(err, &code) && code.SQLState() == "42P05") {
			t.Fatalf("%s: %v", prepare, err)
		}
	}
}

// holderPID returns the backend pid holding key, seen directly.
func holderPID(t *testing.T, direct *sql.DB, key int64) int {
	t.Helper()
	var pid int
	if err := direct.QueryRow("SELECT pid FROM pg_locks WHERE " + keyWhere(key)).Scan(&pid); err != nil {
		t.Fatalf("finding the session holding the lock: %v", err)
	}
	return pid
}

// keyWhere matches a granted advisory lock on the bigint key in pg_locks.
func keyWhere(key int64) string {
	k := uint64(key)
	return fmt.Sprintf("locktype = 'advisory' AND granted AND objsubid = 1 AND classid = %d AND objid = %d AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", k>>32, k&0xFFFFFFFF)
}

// terminateHolders ends the server sessions that hold key, and no others
// (PgBouncer replaces a terminated server connection).
func terminateHolders(t *testing.T, direct *sql.DB, key int64) {
	if _, err := direct.Exec("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE " + keyWhere(key)); err != nil {
		t.Errorf("terminating the sessions holding the test's lock: %v", err)
	}
}

// pinServerSession opens transactions through the transaction pool, each
// on its own client connection, until one lands on server session pid,
// and returns it: while it is open, the pooler gives that session to no
// one else. The other transactions are rolled back.
func pinServerSession(t *testing.T, txDSN string, pid int) *sql.Tx {
	t.Helper()
	ctx := context.Background() // a transaction ends with its context
	db := testdb.OpenPostgresDSN(t, "postgres", txDSN)
	var others []*sql.Tx
	defer func() {
		for _, tx := range others {
			_ = tx.Rollback()
		}
	}()
	for range testdb.PgBouncerPoolSize {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("BEGIN through the transaction pool: %v", err)
		}
		var got int
		if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&got); err != nil {
			t.Fatalf("reading the pinned session: %v", err)
		}
		if got == pid {
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		}
		others = append(others, tx)
	}
	t.Fatalf("no transaction through the pool (size %d) landed on server session %d", testdb.PgBouncerPoolSize, pid)
	return nil
}

// newAndCheck is New followed by Check, which runs the first-use checks
// (the pooler probe among them) that New leaves to the first operation.
func newAndCheck(db advisorylock.DB, name string, opts ...advisorylock.Option) (*advisorylock.Lock, error) {
	l, err := advisorylock.New(db, name, opts...)
	if err != nil {
		return nil, err
	}
	return l, l.Check(context.Background())
}
