package advisorylock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// fillUntilRefused takes session locks on db, each pinning a connection,
// until one is refused, and returns that error; it fails the test if
// none is refused within max tries. The locks are released at cleanup.
func fillUntilRefused(t *testing.T, db advisorylock.DB, max int) error {
	t.Helper()
	ctx := context.Background()
	for i := range max {
		l := newLock(t, db, testdb.UniqueName(t)+"-"+string(rune('a'+i)), quiet, pinned)
		g, err := l.TryLock(ctx)
		if err != nil {
			if !strings.Contains(err.Error(), l.Name()) {
				t.Errorf("the error does not name the lock %q: %v", l.Name(), err)
			}
			return err
		}
		t.Cleanup(func() { _ = g.Release(ctx) })
	}
	t.Fatalf("no lock was refused in %d tries: the server's connection limit is not reached", max)
	return nil
}

// checkLimitError asserts that err, an acquire refused at the server's
// connection limit, is ErrPoolUnavailable, names the limit, keeps the
// driver's error reachable (found by reachable) and wraps no nil.
func checkLimitError(t *testing.T, err error, limit string, reachable func(error) bool) {
	t.Helper()
	msg := err.Error()
	if !errors.Is(err, advisorylock.ErrPoolUnavailable) || !strings.Contains(msg, limit) || !reachable(err) || strings.Contains(msg, "%!") {
		t.Errorf("at the connection limit: %v; want ErrPoolUnavailable naming %s, the driver's error reachable, no %%!w", err, limit)
	}
}

// At the server's connection limit an acquire fails with
// ErrPoolUnavailable that says which limit was hit and keeps the server's
// refusal (SQLSTATE 53300) reachable, on lib/pq and pgx, for a Lock (a
// pinned connection) and a LeaseLock (a statement on the pool).
func TestAcquireAtTheConnectionLimitKeepsTheServersReason(t *testing.T) {
	testdb.Slow(t, "starts a private PostgreSQL cluster")
	testdb.CheckGoroutines(t)
	c := testdb.OwnCluster(t, "max_connections=5", "superuser_reserved_connections=0")
	is53300 := func(err error) bool {
		var s interface{ SQLState() string }
		return errors.As(err, &s) && s.SQLState() == "53300"
	}
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgresDSN(t, drv, c.DSN)
			// Every test's pool counts against the cluster's five.
			checkLimitError(t, fillUntilRefused(t, db, 6), "max_connections", is53300)

			lease, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), quiet)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxIdleConns(0) // the lease's statement needs a new connection
			_, err = lease.TryLock(context.Background())
			checkLimitError(t, err, "max_connections", is53300)
		})
	}
}

// The same on MariaDB, at a user's MAX_USER_CONNECTIONS (1226).
func TestMySQLAcquireAtTheConnectionLimitKeepsTheServersReason(t *testing.T) {
	testdb.CheckGoroutines(t)
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := testdb.OpenMySQL(t)
	user := "advisorylock_limited"
	ctx := context.Background()
	_, _ = admin.ExecContext(ctx, "DROP USER IF EXISTS '"+user+"'@'%'")
	for _, q := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'limited' WITH MAX_USER_CONNECTIONS 2",
		"GRANT ALL ON `" + cfg.DBName + "`.* TO '" + user + "'@'%'",
	} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(ctx, "DROP USER IF EXISTS '"+user+"'@'%'") })
	cfg.User, cfg.Passwd = user, "limited"
	db := testdb.OpenMySQLDSN(t, cfg.FormatDSN())

	is1226 := func(err error) bool {
		var e *mysql.MySQLError
		return errors.As(err, &e) && e.Number == 1226
	}
	checkLimitError(t, fillUntilRefused(t, db, 3), "MAX_USER_CONNECTIONS", is1226)
}
