package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Every lock step is one round trip on both drivers, a shared lock's
// steps too: counted on the wire, as ReadyForQuery messages through a
// proxy.
func TestEachLockStepIsOneRoundTrip(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			l := newLock(t, db, testdb.UniqueName(t))
			// Warm up: pgx prepares each statement text once per connection.
			for _, acquire := range []func(context.Context) (*advisorylock.Guard, error){l.TryLock, l.Lock, l.TryRLock, l.RLock} {
				g, err := acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				mustRelease(t, g)
			}
			for _, step := range []struct {
				name    string
				acquire func(context.Context) (*advisorylock.Guard, error)
			}{{"TryLock", l.TryLock}, {"Lock", l.Lock}, {"TryRLock", l.TryRLock}, {"RLock", l.RLock}} {
				proxy.ResetCount()
				g, err := step.acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n := proxy.RoundTrips(); n != 1 {
					t.Errorf("%s took %d round trips, want 1", step.name, n)
				}
				proxy.ResetCount()
				mustRelease(t, g)
				if n := proxy.RoundTrips(); n != 1 {
					t.Errorf("Release after %s took %d round trips, want 1", step.name, n)
				}
			}
		})
	}
}

// lockStatementsPrepared counts the statements of db's one connection
// that are prepared on its session and take or free an advisory lock.
func lockStatementsPrepared(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%advisory_lock%' OR statement LIKE '%advisory_unlock%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// On lib/pq, the try and the unlock are prepared once per session and
// then only bound and executed: the same two statements however many
// steps run, each step still one round trip (above).
func TestLibPQPreparesTheTryAndTheUnlockOncePerSession(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(1)
	l := newLock(t, db, testdb.UniqueName(t))
	for range 3 {
		mustRelease(t, mustTry(t, l))
	}
	if n := lockStatementsPrepared(t, db); n != 2 {
		t.Fatalf("after three steps the session has %d lock statements prepared, want 2 (the try, the unlock)", n)
	}
	for range 20 {
		mustRelease(t, mustTry(t, l))
	}
	if n := lockStatementsPrepared(t, db); n != 2 {
		t.Fatalf("after twenty more steps the session has %d lock statements prepared, want still 2", n)
	}
}

// A session that lost its prepared statements (DEALLOCATE ALL run on it
// by the application) still takes and frees the lock: the step runs as
// text, and the next one prepares again.
func TestLibPQLockAfterTheSessionLostItsPreparedStatements(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(1)
	other := testdb.OpenPostgres(t, "postgres")
	name := testdb.UniqueName(t)
	l, rival := newLock(t, db, name), newLock(t, other, name)
	for range 2 {
		mustRelease(t, mustTry(t, l))
	}
	if n := lockStatementsPrepared(t, db); n != 2 {
		t.Fatalf("the session has %d lock statements prepared, want 2", n)
	}
	if _, err := db.Exec("DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	g := mustTry(t, l)
	if _, err := rival.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("a rival's TryLock while the lock is held: %v, want ErrNotAcquired", err)
	}
	mustRelease(t, g)
	mustRelease(t, mustTry(t, rival))
	mustRelease(t, mustTry(t, l))
	if n := lockStatementsPrepared(t, db); n != 2 {
		t.Fatalf("after the steps that followed, the session has %d lock statements prepared, want 2 again", n)
	}
}
