package benchmarks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/dbutil"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	"github.com/pressly/goose/v3/lock"
)

// pgEnv is what an operation's setup gets: the driver, the DSN it opened
// (direct or through the counting proxy) and a handle with a small pool.
type pgEnv struct {
	drv string
	dsn string
	db  *sql.DB
}

// pgOp is one uncontended operation on PostgreSQL. setup runs outside the
// timed loop and returns one iteration of it.
type pgOp struct {
	name    string
	drivers []string
	setup   func(b *testing.B, e pgEnv) func(ctx context.Context) error
}

// pgOps are the uncontended per-op benchmarks, in the order the report
// lists them. "pool" means a pool checkout is part of every iteration,
// "pinned" that one connection is checked out for the whole benchmark.
var pgOps = []pgOp{
	{"select1_pinned", pgDrivers, setupSelect1Pinned},
	{"select1_pool", pgDrivers, setupSelect1Pool},
	{"raw_param", []string{"pq", "pqbin", "pgx"}, setupRawParam},
	{"raw_literal", pgDrivers, setupRawLiteral},
	{"raw_prepared", pgDrivers, setupRawPrepared},
	{"raw_literal_shared", pgDrivers, setupRawLiteralShared},
	{"raw_pool", pgDrivers, setupRawPool(releasePlain)},
	{"raw_pool_bounded", pgDrivers, setupRawPool(releaseBounded)},
	{"raw_pool_ask", pgDrivers, setupRawPool(releaseAsk)},
	{"raw_pool_ask_nowatch", pgDrivers, setupRawPool(releaseAskNoWatch)},
	{"raw_pool_worker", pgDrivers, setupRawPoolWorker},
	{"raw_pool_watchdog", pgDrivers, setupRawPool(releaseWatchdog)},
	{"raw_pool_floor", pgDrivers, setupRawPool(releaseFloor)},
	{"trylock_release", pgDrivers, setupTryLock(nil)},
	{"tryrlock_release", pgDrivers, setupTryRLock},
	{"trylock_release_nokeepalive", pgDrivers, setupTryLock([]advisorylock.Option{advisorylock.WithKeepAlive(0)})},
	{"trylock_release_noop", pgDrivers, setupObservedTryLock("noop")},
	{"trylock_release_otel", pgDrivers, setupObservedTryLock("otel")},
	{"trylock_release_prom", pgDrivers, setupObservedTryLock("prom")},
	{"trylock_release_otel_traced", pgDrivers, setupTracedTryLock},
	{"trydo", pgDrivers, setupTryDo},
	{"trydo_minhold", pgDrivers, setupTryDoMinHold},
	{"trydo_once", pgDrivers, setupTryDoOnce},
	{"lock_release", pgDrivers, setupLockRelease},
	{"goose_session", pgDrivers, setupGooseSession},
	{"migrate", pgDrivers, setupMigrate},
	{"leaselock", pgDrivers, setupLeaseLock},
	{"leaselock_minhold", pgDrivers, setupLeaseLockMinHold},
	{"lease_raw_param", pgDrivers, setupLeaseRaw(leaseParam)},
	{"lease_raw_param_bounded", pgDrivers, setupLeaseRaw(leaseParamBounded)},
	{"lease_raw_literal", pgDrivers, setupLeaseRaw(leaseLiteral)},
	{"lease_raw_literal_async_release", pgDrivers, setupLeaseRaw(leaseLiteralAsync)},
	{"goose_table", pgDrivers, setupGooseTable},
}

// BenchmarkPG measures each uncontended operation once per driver.
func BenchmarkPG(b *testing.B) {
	for _, op := range pgOps {
		for _, drv := range op.drivers {
			b.Run(op.name+"/"+drv, func(b *testing.B) {
				dsn := postgresDSN()
				db := openPG(b, drv, dsn, 4)
				warm(b, db, 2)
				runOp(b, op.setup(b, pgEnv{drv: drv, dsn: dsn, db: db}))
			})
		}
	}
}

// BenchmarkRoundTrips runs each operation through a proxy that counts
// PostgreSQL round trips (ReadyForQuery messages) and reports them per
// iteration as rt/op. Its times include the proxy and mean nothing.
func BenchmarkRoundTrips(b *testing.B) {
	for _, op := range pgOps {
		for _, drv := range op.drivers {
			b.Run(op.name+"/"+drv, func(b *testing.B) {
				p := startProxy(b, targetAddr(postgresDSN()))
				dsn := withHostPort(postgresDSN(), p.addr())
				db := openPG(b, drv, dsn, 4)
				warm(b, db, 2)
				step := op.setup(b, pgEnv{drv: drv, dsn: dsn, db: db})
				p.resetCount()
				runOp(b, step)
				b.ReportMetric(float64(p.roundTrips())/float64(b.N), "rt/op")
			})
		}
	}
}

// runOp times b.N iterations of step. Besides the mean (ns/op) it reports
// the median iteration (p50-ns), which a burst of load on a shared
// machine moves far less.
func runOp(b *testing.B, step func(ctx context.Context) error) {
	ctx := context.Background()
	lat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t := time.Now()
		if err := step(ctx); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t)
	}
	b.StopTimer()
	b.ReportMetric(float64(median(lat)), "p50-ns")
}

// median returns the median of d, sorting it.
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)/2]
}

// pgPairs are measured side by side by BenchmarkPaired: the targets
// that compare two operations. ratio = p50(op) / p50(base).
var pgPairs = []struct{ base, op string }{
	{"select1_pinned", "raw_literal"},
	{"raw_literal", "raw_pool"},
	{"raw_literal", "raw_prepared"},
	{"raw_pool", "raw_pool_bounded"},
	{"raw_pool", "raw_pool_ask"},
	{"raw_pool", "raw_pool_ask_nowatch"},
	{"raw_pool", "raw_pool_watchdog"},
	{"raw_pool_watchdog", "raw_pool_floor"},
	{"raw_literal", "raw_pool_floor"},
	{"raw_pool_floor", "trylock_release"},
	{"raw_pool_ask", "trylock_release"},
	{"select1_pinned", "trylock_release"},
	{"raw_pool_bounded", "trylock_release"},
	{"trylock_release_nokeepalive", "trylock_release"},
	{"trylock_release", "trylock_release_noop"},
	{"trylock_release", "trylock_release_otel"},
	{"trylock_release", "trylock_release_prom"},
	{"trylock_release", "trylock_release_otel_traced"},
	{"select1_pinned", "trylock_release_nokeepalive"},
	{"select1_pinned", "trydo"},
	{"select1_pinned", "raw_param"},
	{"select1_pinned", "goose_session"},
	{"leaselock", "goose_table"},
	{"raw_literal", "trylock_release"},
	{"raw_literal", "trydo"},
	{"raw_pool_ask_nowatch", "trylock_release"},
	{"raw_pool_ask_nowatch", "raw_pool_worker"},
	{"raw_pool", "trylock_release"},
	{"trydo", "trydo_minhold"},
	{"trydo", "trydo_once"},
	{"leaselock", "leaselock_minhold"},
	{"raw_literal_shared", "tryrlock_release"},
	{"trylock_release", "tryrlock_release"},
}

// sqlitePairs are measured side by side by BenchmarkPaired on one SQLite
// file: the library against its own bare statements (LeaseLock's with
// the read of the token counter, the gate's base; and without it, which
// says what that read costs).
var sqlitePairs = []struct{ base, op string }{
	{"raw_lock", "lock"},
	{"raw_lease_tokens", "leaselock"},
	{"raw_lease", "raw_lease_tokens"},
	{"raw_lease", "leaselock"},
}

// BenchmarkPaired alternates two operations on one handle, iteration by
// iteration (in alternating order), and reports the median of each
// (base-p50-ns, op-p50-ns) and their ratio (x-base): a burst of load hits
// both alike, so the ratio holds on a noisy machine.
func BenchmarkPaired(b *testing.B) {
	ops := map[string]pgOp{}
	for _, op := range pgOps {
		ops[op.name] = op
	}
	for _, pair := range pgPairs {
		for _, drv := range pgDrivers {
			b.Run(pair.op+"_vs_"+pair.base+"/"+drv, func(b *testing.B) {
				dsn := postgresDSN()
				db := openPG(b, drv, dsn, 4)
				warm(b, db, 3)
				e := pgEnv{drv: drv, dsn: dsn, db: db}
				runPaired(b, ops[pair.base].setup(b, e), ops[pair.op].setup(b, e))
			})
		}
	}
	sqlite := map[string]func(b *testing.B, db *sql.DB) func(ctx context.Context) error{}
	for _, op := range sqliteOps {
		sqlite[op.name] = op.setup
	}
	for _, pair := range sqlitePairs {
		b.Run(pair.op+"_vs_"+pair.base+"/sqlite", func(b *testing.B) {
			db := openSQLite(b, sqlitePath(b))
			runPaired(b, sqlite[pair.base](b, db), sqlite[pair.op](b, db))
		})
	}
}

// runPaired times b.N iterations of base and op, alternating which goes
// first, and reports their medians and ratio.
func runPaired(b *testing.B, base, op func(ctx context.Context) error) {
	ctx := context.Background()
	baseLat, opLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
	timed := func(step func(context.Context) error, into *time.Duration) {
		t := time.Now()
		if err := step(ctx); err != nil {
			b.Fatal(err)
		}
		*into = time.Since(t)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			timed(base, &baseLat[i])
			timed(op, &opLat[i])
		} else {
			timed(op, &opLat[i])
			timed(base, &baseLat[i])
		}
	}
	b.StopTimer()
	bm, om := median(baseLat), median(opLat)
	b.ReportMetric(float64(bm), "base-p50-ns")
	b.ReportMetric(float64(om), "op-p50-ns")
	b.ReportMetric(float64(om)/float64(bm), "x-base")
}

func setupSelect1Pinned(b *testing.B, e pgEnv) func(ctx context.Context) error {
	conn := pin(b, e.db)
	return func(ctx context.Context) error {
		var n int
		return conn.QueryRowContext(ctx, "SELECT 1").Scan(&n)
	}
}

func setupSelect1Pool(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var n int
		return e.db.QueryRowContext(ctx, "SELECT 1").Scan(&n)
	}
}

// setupRawParam is the floor a user would hand-write: try and unlock with
// the key as a parameter, on a connection pinned for the benchmark.
func setupRawParam(b *testing.B, e pgEnv) func(ctx context.Context) error {
	conn := pin(b, e.db)
	key := advisorylock.Key(lockName(b, "raw"))
	return func(ctx context.Context) error {
		var ok bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errNotGranted
		}
		return conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok)
	}
}

// setupRawLiteral is the protocol floor: the key as a literal, one round
// trip per statement on every driver.
func setupRawLiteral(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return rawLiteral(b, e, "pg_try_advisory_lock", "pg_advisory_unlock")
}

// setupRawPrepared is the bare try and unlock prepared once on a pinned
// connection and then only executed with the key as an argument: what
// advisorylock sends on lib/pq (pgx prepares every statement it is given
// arguments for, so there it is raw_param's form).
func setupRawPrepared(b *testing.B, e pgEnv) func(ctx context.Context) error {
	conn := pin(b, e.db)
	key := advisorylock.Key(lockName(b, "raw"))
	prepare := func(q string) *sql.Stmt {
		st, err := conn.PrepareContext(context.Background(), q)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		return st
	}
	try := prepare("SELECT WHERE pg_try_advisory_lock($1::bigint)")
	unlock := prepare("SELECT WHERE pg_advisory_unlock($1::bigint)")
	return func(ctx context.Context) error {
		res, err := try.ExecContext(ctx, key)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errNotGranted
		}
		_, err = unlock.ExecContext(ctx, key)
		return err
	}
}

// setupRawLiteralShared is setupRawLiteral in shared mode: the bare
// pg_try_advisory_lock_shared and pg_advisory_unlock_shared.
func setupRawLiteralShared(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return rawLiteral(b, e, "pg_try_advisory_lock_shared", "pg_advisory_unlock_shared")
}

// rawLiteral tries with the function try and unlocks with unlock, the key
// as a literal, on a connection pinned for the benchmark.
func rawLiteral(b *testing.B, e pgEnv, try, unlock string) func(ctx context.Context) error {
	conn := pin(b, e.db)
	key := strconv.FormatInt(advisorylock.Key(lockName(b, "raw")), 10)
	try = "SELECT " + try + "(" + key + ")"
	unlock = "SELECT " + unlock + "(" + key + ")"
	return func(ctx context.Context) error {
		var ok bool
		if err := conn.QueryRowContext(ctx, try).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errNotGranted
		}
		return conn.QueryRowContext(ctx, unlock).Scan(&ok)
	}
}

// setupTryRLock is an uncontended shared TryRLock and Release.
func setupTryRLock(b *testing.B, e pgEnv) func(ctx context.Context) error {
	l := newLock(b, e.db, lockName(b, "lock"))
	return func(ctx context.Context) error {
		g, err := l.TryRLock(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}

// releaseForm is how a hand-written release bounds its unlock.
type releaseForm int

const (
	releasePlain      releaseForm = iota // the caller's context: unbounded
	releaseBounded                       // its own context, bounded to 5s: the driver watches it
	releaseAsk                           // bounded, and the unlock runs in a goroutine the caller stops waiting for at the bound (a network cut that the driver does not notice)
	releaseAskNoWatch                    // as releaseAsk, but the statement's context has no Done channel, so neither database/sql nor the driver starts a watcher
	releaseWatchdog                      // the unlock on the caller's goroutine with no Done channel; a timer closes the driver connection at the bound (what advisorylock does on lib/pq)
	releaseFloor                         // as releaseWatchdog, and the checkout in a goroutine the caller stops waiting for at the pool-wait bound (lib/pq does not end a new connection's startup when its context ends): every dead-network bound that lib/pq needs
)

// setupRawPool is what the library must do at least, written by hand: a
// pool checkout, try and unlock in one round trip each (literal key), and
// the connection back to the pool, with the unlock bounded as form says.
func setupRawPool(form releaseForm) func(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return func(b *testing.B, e pgEnv) func(ctx context.Context) error {
		key := strconv.FormatInt(advisorylock.Key(lockName(b, "raw")), 10)
		try := "SELECT pg_try_advisory_lock(" + key + ")"
		unlock := "SELECT pg_advisory_unlock(" + key + ")"
		return func(ctx context.Context) error {
			checkout := e.db.Conn
			if form == releaseFloor {
				checkout = func(ctx context.Context) (*sql.Conn, error) { return checkoutAbandonable(ctx, e.db) }
			}
			conn, err := checkout(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			var ok bool
			if err := conn.QueryRowContext(ctx, try).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errNotGranted
			}
			switch form {
			case releasePlain:
				return conn.QueryRowContext(ctx, unlock).Scan(&ok)
			case releaseWatchdog, releaseFloor:
				return unlockWatched(ctx, conn, unlock)
			}
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if form == releaseBounded {
				return conn.QueryRowContext(uctx, unlock).Scan(&ok)
			}
			sctx := uctx
			if form == releaseAskNoWatch {
				sctx = context.WithoutCancel(ctx)
			}
			_, err = dbutil.Within(uctx, func() (struct{}, error) {
				return struct{}{}, conn.QueryRowContext(sctx, unlock).Scan(new(bool))
			}, nil, nil)
			return err
		}
	}
}

// checkoutAbandonable checks a connection out of db in a goroutine that
// the caller stops waiting for after the library's default pool wait.
func checkoutAbandonable(ctx context.Context, db *sql.DB) (*sql.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return dbutil.Within(ctx, func() (*sql.Conn, error) { return db.Conn(ctx) }, nil, func(late *sql.Conn) {
		if late != nil {
			_ = late.Close()
		}
	})
}

// unlockWatched runs unlock on the caller's goroutine, its context without
// Done, under a timer that would close the driver connection at the bound.
func unlockWatched(ctx context.Context, conn *sql.Conn, unlock string) error {
	var dc io.Closer
	_ = conn.Raw(func(c any) error { dc, _ = c.(io.Closer); return nil })
	t := time.AfterFunc(5*time.Second, func() { _ = dc.Close() })
	var ok bool
	err := conn.QueryRowContext(context.WithoutCancel(ctx), unlock).Scan(&ok)
	if !t.Stop() {
		return errors.New("the unlock took 5s: its connection was closed")
	}
	return err
}

func newLock(b *testing.B, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	l, err := advisorylock.New(db, name, opts...)
	must(b, err, "advisorylock.New")
	return l
}

func setupTryLock(opts []advisorylock.Option) func(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return func(b *testing.B, e pgEnv) func(ctx context.Context) error {
		l := newLock(b, e.db, lockName(b, "lock"), opts...)
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	}
}

func setupTryDo(b *testing.B, e pgEnv) func(ctx context.Context) error {
	l := newLock(b, e.db, lockName(b, "lock"))
	noop := func(context.Context) error { return nil }
	return func(ctx context.Context) error {
		ran, err := l.TryDo(ctx, noop)
		if err == nil && !ran {
			err = errNotGranted
		}
		return err
	}
}

// setupTryDoOnce runs a new run key each iteration: the try, the read of
// the run's record, the no-op, the record's write and the release.
func setupTryDoOnce(b *testing.B, e pgEnv) func(ctx context.Context) error {
	l := newLock(b, e.db, lockName(b, "once"))
	must(b, l.Check(context.Background()), "Check")
	noop := func(context.Context) error { return nil }
	// Run keys unique to this setup: the benchmark may set up again.
	prefix, i := strconv.FormatInt(time.Now().UnixNano(), 36)+"/", 0
	return func(ctx context.Context) error {
		i++
		ran, err := l.TryDoOnce(ctx, prefix+strconv.Itoa(i), noop)
		if err == nil && !ran {
			err = errNotGranted
		}
		return err
	}
}

func setupLockRelease(b *testing.B, e pgEnv) func(ctx context.Context) error {
	l := newLock(b, e.db, lockName(b, "lock"))
	return func(ctx context.Context) error {
		g, err := l.Lock(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}

// setupGooseSession is goose v3's PostgreSQL session locker on a pinned
// connection (its documented use).
func setupGooseSession(b *testing.B, e pgEnv) func(ctx context.Context) error {
	conn := pin(b, e.db)
	l, err := lock.NewPostgresSessionLocker(lock.WithLockID(advisorylock.Key(lockName(b, "goose"))))
	must(b, err, "goose session locker")
	return func(ctx context.Context) error {
		if err := l.SessionLock(ctx, conn); err != nil {
			return err
		}
		return l.SessionUnlock(ctx, conn)
	}
}

// setupGooseTable is goose v3's PostgreSQL table (lease-row) locker, on
// its own table.
func setupGooseTable(b *testing.B, e pgEnv) func(ctx context.Context) error {
	table := tableName("goose")
	dropAtCleanup(b, table)
	l, err := lock.NewPostgresTableLocker(lock.WithTableName(table), lock.WithTableLockID(positiveID(lockName(b, "goose"))))
	must(b, err, "goose table locker")
	return func(ctx context.Context) error {
		if err := l.Lock(ctx, e.db); err != nil {
			return err
		}
		return l.Unlock(ctx, e.db)
	}
}

// setupMigrate is golang-migrate's PostgreSQL driver Lock/Unlock, on a
// migrations table of its own (the lock id derives from its name).
func setupMigrate(b *testing.B, e pgEnv) func(ctx context.Context) error {
	drv := newMigrate(b, e.db, tableName("migrate"))
	return func(context.Context) error {
		if err := drv.Lock(); err != nil {
			return err
		}
		return drv.Unlock()
	}
}

// newMigrate returns a golang-migrate PostgreSQL driver on a pinned
// connection of db, with its own migrations table, dropped at cleanup.
func newMigrate(b *testing.B, db *sql.DB, table string) *postgres.Postgres {
	dropAtCleanup(b, table)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	must(b, err, "migrate: pin a connection")
	drv, err := postgres.WithConnection(ctx, conn, &postgres.Config{MigrationsTable: table})
	must(b, err, "migrate: postgres.WithConnection")
	b.Cleanup(func() { _ = drv.Close() })
	return drv
}

func newLeaseLock(b *testing.B, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.LeaseLock {
	l, err := advisorylock.NewLeaseLock(db, name, opts...)
	must(b, err, "advisorylock.NewLeaseLock")
	return l
}

func setupLeaseLock(b *testing.B, e pgEnv) func(ctx context.Context) error {
	name := lockName(b, "lease")
	forgetLease(b, name)
	l := newLeaseLock(b, e.db, name)
	return func(ctx context.Context) error {
		g, err := l.TryLock(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}

// leaseForm is how the raw lease floor sends its two statements.
type leaseForm int

const (
	leaseParam        leaseForm = iota // values as parameters, as a user would write it
	leaseParamBounded                  // as leaseParam, the release bounded by its own 5s context, as Release is
	leaseLiteral                       // values as literals: one round trip on every driver
	leaseLiteralAsync                  // literals, release committed with synchronous_commit off
)

// setupLeaseRaw is the floor of a lease with fencing: one upsert that takes
// a free or expired row and increments its generation (durable), and one
// update that frees it if the generation still matches.
func setupLeaseRaw(form leaseForm) func(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return func(b *testing.B, e pgEnv) func(ctx context.Context) error {
		table := tableName("lease")
		dropAtCleanup(b, table)
		exec(b, e.db, "CREATE TABLE IF NOT EXISTS "+table+` (
  name text PRIMARY KEY, owner text, generation bigint NOT NULL,
  acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)`)
		name := lockName(b, "lease")
		owner := "bench-" + runID
		acquire := "INSERT INTO " + table + ` AS t (name, owner, generation, acquired_at, expires_at)
VALUES ($1, $2, 1, now(), now() + $3 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, generation = t.generation + 1,
  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE t.owner IS NULL OR t.expires_at <= now()
RETURNING generation`
		release := "UPDATE " + table + " SET owner = NULL, expires_at = now() WHERE name = $1 AND generation = $2"
		ttl := (30 * time.Second).Milliseconds()
		switch form {
		case leaseParam:
			return func(ctx context.Context) error {
				var gen int64
				if err := e.db.QueryRowContext(ctx, acquire, name, owner, ttl).Scan(&gen); err != nil {
					return err
				}
				_, err := e.db.ExecContext(ctx, release, name, gen)
				return err
			}
		case leaseParamBounded:
			return func(ctx context.Context) error {
				var gen int64
				if err := e.db.QueryRowContext(ctx, acquire, name, owner, ttl).Scan(&gen); err != nil {
					return err
				}
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_, err := e.db.ExecContext(rctx, release, name, gen)
				return err
			}
		}
		acquireLit := literalize(acquire, quote(name), quote(owner), strconv.FormatInt(ttl, 10))
		prefix := ""
		if form == leaseLiteralAsync {
			prefix = "SET LOCAL synchronous_commit = off; "
		}
		return func(ctx context.Context) error {
			var gen int64
			if err := e.db.QueryRowContext(ctx, acquireLit).Scan(&gen); err != nil {
				return err
			}
			_, err := e.db.ExecContext(ctx, prefix+literalize(release, quote(name), strconv.FormatInt(gen, 10)))
			return err
		}
	}
}

// literalize replaces $1, $2, … in q by vals, from the highest number down
// so that $1 does not match the start of $10.
func literalize(q string, vals ...string) string {
	for i := len(vals); i >= 1; i-- {
		q = strings.ReplaceAll(q, fmt.Sprintf("$%d", i), vals[i-1])
	}
	return q
}

// setupRawPoolWorker is raw_pool_ask_nowatch with the unlock handed to a
// worker goroutine that lives as long as the benchmark instead of a fresh
// goroutine per statement: what a per-connection worker would cost.
func setupRawPoolWorker(b *testing.B, e pgEnv) func(ctx context.Context) error {
	key := strconv.FormatInt(advisorylock.Key(lockName(b, "raw")), 10)
	try := "SELECT pg_try_advisory_lock(" + key + ")"
	unlock := "SELECT pg_advisory_unlock(" + key + ")"
	type job struct {
		conn *sql.Conn
		out  chan error
	}
	jobs := make(chan job)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case j := <-jobs:
				var ok bool
				j.out <- j.conn.QueryRowContext(context.Background(), unlock).Scan(&ok)
			case <-stop:
				return
			}
		}
	}()
	b.Cleanup(func() { close(stop) })
	out := make(chan error, 1)
	return func(ctx context.Context) error {
		conn, err := e.db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		var ok bool
		if err := conn.QueryRowContext(ctx, try).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errNotGranted
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		jobs <- job{conn, out}
		select {
		case err := <-out:
			return err
		case <-uctx.Done():
			return uctx.Err()
		}
	}
}
