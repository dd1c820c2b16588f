// Package sqlxcompat_test proves that locks work through jmoiron/sqlx's
// *sqlx.DB on PostgreSQL (lib/pq and pgx) and MariaDB: the library finds
// the *sql.DB that sqlx.DB embeds, its pin and its first-use verdicts
// (the pooler probe) are those of that *sql.DB. It is a module of its own
// so that sqlx, and the drivers its go.mod requires, stay out of the
// library's module graph; the root suite tests the same shape with a
// handle that embeds a *sql.DB.
package sqlxcompat_test

import (
	"context"
	"errors"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/jmoiron/sqlx"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// eachSqlx runs f with a function that opens a new *sqlx.DB per call, on
// each PostgreSQL driver and on MariaDB.
func eachSqlx(t *testing.T, f func(t *testing.T, open func() *sqlx.DB)) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			f(t, func() *sqlx.DB { return sqlx.NewDb(testdb.OpenPostgres(t, drv), drv) })
		})
	}
	t.Run("mysql", func(t *testing.T) {
		f(t, func() *sqlx.DB { return sqlx.NewDb(testdb.OpenMySQL(t), "mysql") })
	})
}

// TestLocksExcludeThroughSqlx: a Lock and a LeaseLock taken through one
// *sqlx.DB exclude the same name taken through another, show a holder,
// and are free for the other once released.
func TestLocksExcludeThroughSqlx(t *testing.T) {
	eachSqlx(t, func(t *testing.T, open func() *sqlx.DB) {
		ctx := context.Background()
		a, b := open(), open()
		name := testdb.UniqueName(t)
		for what, pair := range map[string][2]locker{
			"Lock":      {mustLock(t, a, name), mustLock(t, b, name)},
			"LeaseLock": {mustLease(t, a, name+"/lease"), mustLease(t, b, name+"/lease")},
		} {
			release, err := pair[0].tryLock(ctx)
			if err != nil {
				t.Fatalf("%s: TryLock through sqlx: %v", what, err)
			}
			if _, err := pair[1].tryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("%s: a second TryLock through another *sqlx.DB = %v, want ErrNotAcquired", what, err)
			}
			if h, err := pair[1].holder(ctx); err != nil || h == nil {
				t.Fatalf("%s: Holder while held = %+v, %v; want the holder", what, h, err)
			}
			if err := release(ctx); err != nil {
				t.Fatalf("%s: Release: %v", what, err)
			}
			again, err := pair[1].tryLock(ctx)
			if err != nil {
				t.Fatalf("%s: TryLock after the release: %v", what, err)
			}
			if err := again(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if st := a.Stats(); st.InUse != 0 {
			t.Fatalf("%d connections of the *sqlx.DB left checked out", st.InUse)
		}
	})
}

// TestTransactionPoolerIsRefusedThroughSqlx: behind PgBouncer in
// transaction mode a Lock through *sqlx.DB is refused, as through the
// *sql.DB it embeds, and the verdict is shared by the two.
func TestTransactionPoolerIsRefusedThroughSqlx(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			raw := testdb.OpenPostgresDSN(t, drv, txDSN)
			l, err := advisorylock.New(sqlx.NewDb(raw, drv), testdb.UniqueName(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Check(ctx); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Check through sqlx behind a transaction pool = %v, want ErrTransactionPooler", err)
			}
			plain, err := advisorylock.New(raw, testdb.UniqueName(t))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := plain.TryLock(ctx); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("TryLock through the embedded *sql.DB = %v, want the same refusal", err)
			}
		})
	}
}

// locker is what the test does with a Lock or a LeaseLock.
type locker struct {
	tryLock func(context.Context) (release func(context.Context) error, err error)
	holder  func(context.Context) (*advisorylock.Holder, error)
}

// lockerOf is the locker of a Lock or a LeaseLock, given its TryLock
// and Holder.
func lockerOf[G interface{ Release(context.Context) error }](tryLock func(context.Context) (G, error), holder func(context.Context) (*advisorylock.Holder, error)) locker {
	return locker{
		tryLock: func(ctx context.Context) (func(context.Context) error, error) {
			g, err := tryLock(ctx)
			if err != nil {
				return nil, err
			}
			return g.Release, nil
		},
		holder: holder,
	}
}

func mustLock(t *testing.T, db advisorylock.DB, name string) locker {
	t.Helper()
	l, err := advisorylock.New(db, name)
	if err != nil {
		t.Fatal(err)
	}
	return lockerOf(l.TryLock, l.Holder)
}

func mustLease(t *testing.T, db advisorylock.DB, name string) locker {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	return lockerOf(l.TryLock, l.Holder)
}
