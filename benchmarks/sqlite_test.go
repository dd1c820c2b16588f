package benchmarks

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// sqliteOps are the uncontended per-op benchmarks on a SQLite file (WAL,
// busy_timeout 5s). The raw statements are the floor: the one-statement
// upsert that takes a free or expired row, and the delete or update that
// frees it.
var sqliteOps = []struct {
	name  string
	setup func(b *testing.B, db *sql.DB) func(ctx context.Context) error
}{
	{"select1", func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var n int
			return db.QueryRowContext(ctx, "SELECT 1").Scan(&n)
		}
	}},
	{"raw_lock", setupSQLiteRawLock},
	{"lock", func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		l := newLock(b, db, lockName(b, "lock"))
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	}},
	{"raw_lease", setupSQLiteRawLease},
	{"raw_lease_tokens", setupSQLiteRawLeaseTokens},
	{"leaselock", func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		l := newLeaseLock(b, db, lockName(b, "lease"))
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	}},
}

// BenchmarkSQLite measures each uncontended operation on a fresh file.
func BenchmarkSQLite(b *testing.B) {
	for _, op := range sqliteOps {
		b.Run(op.name, func(b *testing.B) {
			db := openSQLite(b, sqlitePath(b))
			runOp(b, op.setup(b, db))
		})
	}
}

func sqliteExec(b *testing.B, db *sql.DB, q string) {
	b.Helper()
	if _, err := db.Exec(q); err != nil {
		b.Fatalf("%s: %v", q, err)
	}
}

func setupSQLiteRawLock(b *testing.B, db *sql.DB) func(ctx context.Context) error {
	sqliteExec(b, db, `CREATE TABLE raw_locks (key INTEGER PRIMARY KEY, name TEXT NOT NULL,
  owner TEXT NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL)`)
	name := lockName(b, "raw")
	key := advisorylock.Key(name)
	owner := "bench-" + runID
	ttl := (30 * time.Second).Milliseconds()
	const acquire = `INSERT INTO raw_locks (key, name, owner, acquired_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?4 + ?5)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE raw_locks.expires_at <= excluded.acquired_at`
	const release = `DELETE FROM raw_locks WHERE key = ?1 AND owner = ?2`
	return func(ctx context.Context) error {
		res, err := db.ExecContext(ctx, acquire, key, name, owner, time.Now().UnixMilli(), ttl)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return errNotGranted
		}
		_, err = db.ExecContext(ctx, release, key, owner)
		return err
	}
}

// setupSQLiteRawLeaseTokens is LeaseLock's own statements, bare, on
// tables of the same shape (sqliteAcquireLease and sqliteReleaseLease in
// internal/sqlitebackend/sqlite.go): the upsert takes its generation from a token
// counter, which a trigger keeps above every generation a deleted row
// had, so that tokens never go down. That read is what raw_lease leaves
// out.
func setupSQLiteRawLeaseTokens(b *testing.B, db *sql.DB) func(ctx context.Context) error {
	sqliteExec(b, db, `CREATE TABLE raw_tokens (id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL)`)
	sqliteExec(b, db, `INSERT INTO raw_tokens VALUES (1, 0)`)
	sqliteExec(b, db, `CREATE TABLE raw_token_leases (name TEXT PRIMARY KEY, owner TEXT,
  generation INTEGER NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL)`)
	sqliteExec(b, db, `CREATE TRIGGER raw_tokens_delete AFTER DELETE ON raw_token_leases
BEGIN UPDATE raw_tokens SET last = max(last, OLD.generation) WHERE id = 1; END`)
	name := lockName(b, "raw")
	owner := "bench-" + runID
	ttl := (30 * time.Second).Milliseconds()
	const acquire = `INSERT INTO raw_token_leases (name, owner, generation, acquired_at, expires_at)
VALUES (?1, ?2, (SELECT last + 1 FROM raw_tokens WHERE id = 1), ?3, ?3 + ?4)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,
	generation = max(raw_token_leases.generation + 1, excluded.generation),
	acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE raw_token_leases.owner IS NULL OR raw_token_leases.expires_at <= excluded.acquired_at
RETURNING generation`
	const release = `UPDATE raw_token_leases SET owner = NULL, expires_at = min(expires_at, ?3)
WHERE name = ?1 AND generation = ?2 AND owner IS NOT NULL`
	return func(ctx context.Context) error {
		var gen int64
		if err := db.QueryRowContext(ctx, acquire, name, owner, time.Now().UnixMilli(), ttl).Scan(&gen); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, release, name, gen, time.Now().UnixMilli())
		return err
	}
}

func setupSQLiteRawLease(b *testing.B, db *sql.DB) func(ctx context.Context) error {
	sqliteExec(b, db, `CREATE TABLE raw_leases (name TEXT PRIMARY KEY, owner TEXT,
  generation INTEGER NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL)`)
	name := lockName(b, "raw")
	owner := "bench-" + runID
	ttl := (30 * time.Second).Milliseconds()
	const acquire = `INSERT INTO raw_leases (name, owner, generation, acquired_at, expires_at) VALUES (?1, ?2, 1, ?3, ?3 + ?4)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, generation = raw_leases.generation + 1,
  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE raw_leases.owner IS NULL OR raw_leases.expires_at <= excluded.acquired_at
RETURNING generation`
	const release = `UPDATE raw_leases SET owner = NULL, expires_at = ?3 WHERE name = ?1 AND generation = ?2`
	return func(ctx context.Context) error {
		now := time.Now().UnixMilli()
		var gen int64
		if err := db.QueryRowContext(ctx, acquire, name, owner, now, ttl).Scan(&gen); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, release, name, gen, time.Now().UnixMilli())
		return err
	}
}

// BenchmarkSQLiteContention runs 32 goroutines on one SQLite file (one
// *sql.DB), each taking a Lock on one of 256 names at random (Lock, so a
// name held by another goroutine is waited for), and releasing it. Each
// iteration is one Lock+Release; p50-us and p99-us are the percentiles of
// their times, ops/s the throughput.
func BenchmarkSQLiteContention(b *testing.B) {
	const goroutines, names = 32, 256
	db := openSQLite(b, sqlitePath(b))
	locks := make([]*advisorylock.Lock, names)
	for i := range locks {
		locks[i] = newLock(b, db, lockName(b, "contention")+strconv.Itoa(i))
	}
	g, err := locks[0].TryLock(context.Background()) // the tables, outside the timing
	must(b, err, "first lock")
	must(b, g.Release(context.Background()), "first release")
	var next atomic.Int64
	times := make([][]time.Duration, goroutines)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range goroutines {
		wg.Go(func() {
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				l := locks[rand.N(names)]
				t0 := time.Now()
				g, err := l.Lock(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				if err := g.Release(ctx); err != nil {
					b.Error(err)
					return
				}
				times[w] = append(times[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(times...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(int(p*float64(len(all))), len(all)-1)]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	b.ReportMetric(pct(0.99)/pct(0.50), "p99-x-p50")
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
}
