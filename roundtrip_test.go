package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

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

// A new Lock on a handle that has served one sends no first-use
// statements: what the handle's first use learned (which backend,
// Validate's checks) is kept per *sql.DB, so a Lock made per entity or
// per request takes and frees in the two lock steps, as one made once.
func TestNewLockOnAWarmHandleTakesTwoRoundTrips(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			cycle := func() int64 {
				for {
					l := newLock(t, db, testdb.UniqueName(t))
					proxy.ResetCount()
					start := time.Now()
					mustRelease(t, mustTry(t, l))
					// pgx pings a connection idle for a second at its next
					// checkout: a cycle that slow is measured again.
					if time.Since(start) < 500*time.Millisecond {
						return proxy.RoundTrips()
					}
				}
			}
			// The handle's first use and its session's checks, then the
			// session's first bare try, which both drivers prepare.
			cycle()
			cycle()
			for i := range 3 {
				if n := cycle(); n != 2 {
					t.Fatalf("new Lock %d on a warm handle: TryLock and Release took %d round trips, want 2", i+3, n)
				}
			}
		})
	}
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

// leaseStep is a lease step prepared on a session: how often it ran, and
// the PREPARE statement that made it.
type leaseStep struct {
	runs    int64
	prepare string
}

// leaseStepsPrepared returns the lease steps prepared on the session of
// db's one connection, by name.
func leaseStepsPrepared(t *testing.T, db *sql.DB) map[string]leaseStep {
	t.Helper()
	rows, err := db.Query(`SELECT name, generic_plans + custom_plans, statement FROM pg_prepared_statements WHERE name LIKE 'advisorylock\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	steps := map[string]leaseStep{}
	for rows.Next() {
		var name string
		var step leaseStep
		if err := rows.Scan(&name, &step.runs, &step.prepare); err != nil {
			t.Fatal(err)
		}
		steps[name] = step
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return steps
}

// leaseCycles takes and frees l n times with TryLock and Release.
func leaseCycles(t *testing.T, l *advisorylock.LeaseLock, n int) {
	t.Helper()
	for range n {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// On lib/pq a lease's acquire and release are prepared once per session
// (by name, with PREPARE) and then run as EXECUTE: the same two
// statements however many steps run, each run once per step.
func TestLibPQPreparesTheLeaseStepsOncePerSession(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(1)
	l := newLeaseLock(t, db, testdb.UniqueName(t))
	var runs int64
	for _, cycles := range []int64{3, 20} {
		leaseCycles(t, l, int(cycles))
		runs += cycles
		steps := leaseStepsPrepared(t, db)
		if len(steps) != 2 {
			t.Fatalf("the session has the lease steps %v prepared, want two (acquire, release)", steps)
		}
		for name, step := range steps {
			if step.runs != runs {
				t.Fatalf("after %d cycles %s ran %d times prepared, want %d", runs, name, step.runs, runs)
			}
		}
	}
}

// A session that lost the lease steps' statements (DEALLOCATE ALL run on
// it by the application, or a pooler that moved the connection) still
// takes and frees the lease: the step runs as text, and the pool's steps
// stay text from then on, one round trip each.
func TestLibPQLeaseAfterTheSessionLostItsPreparedSteps(t *testing.T) {
	db, proxy := testdb.OpenPostgresProxied(t, "postgres")
	db.SetMaxOpenConns(1)
	name := testdb.UniqueName(t)
	l, rival := newLeaseLock(t, db, name), newLeaseLock(t, testdb.OpenPostgres(t, "postgres"), name)
	leaseCycles(t, l, 2)
	if steps := leaseStepsPrepared(t, db); len(steps) != 2 {
		t.Fatalf("the session has the lease steps %v prepared, want two", steps)
	}
	if _, err := db.Exec("DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rival.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("a rival's TryLock while the lease is held: %v, want ErrNotAcquired", err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	leaseCycles(t, rival, 1)
	proxy.ResetCount()
	leaseCycles(t, l, 2)
	if n := proxy.RoundTrips(); n != 4 {
		t.Fatalf("two TryLock and Release cycles after the loss took %d round trips, want 4", n)
	}
	if steps := leaseStepsPrepared(t, db); len(steps) != 0 {
		t.Fatalf("after a step lost its statement the session has %v prepared again, want the steps sent as text", steps)
	}
}

// A lease step already prepared under its name on the session (another
// client's, as behind a transaction-mode pooler, where sessions are
// shared) is run as it is: the name is a hash of the text, so it is the
// same statement.
func TestLibPQLeaseStepPreparedByAnotherClientRuns(t *testing.T) {
	first := testdb.OpenPostgres(t, "postgres")
	first.SetMaxOpenConns(1)
	name := testdb.UniqueName(t)
	leaseCycles(t, newLeaseLock(t, first, name), 1)
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(1)
	prepared := leaseStepsPrepared(t, first)
	if len(prepared) != 2 {
		t.Fatalf("the first client's session has the lease steps %v prepared, want two", prepared)
	}
	for _, step := range prepared {
		if _, err := db.Exec(step.prepare); err != nil {
			t.Fatalf("preparing %q on the second client's session: %v", step.prepare, err)
		}
	}
	leaseCycles(t, newLeaseLock(t, db, name), 2)
	steps := leaseStepsPrepared(t, db)
	for name, step := range steps {
		if step.runs != 2 {
			t.Fatalf("%s, prepared before by another client, ran %d times, want 2", name, step.runs)
		}
	}
	if len(steps) != 2 {
		t.Fatalf("the session has the lease steps %v prepared, want the two prepared before", steps)
	}
}
