package benchmarks

import (
	"context"
	"database/sql"
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
