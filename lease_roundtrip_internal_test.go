package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// pgxPingAfter is how long a pgx stdlib connection may sit idle before
// database/sql's ResetSession makes pgx ping it on the next checkout: a
// round trip of the driver's, not ours. A measurement that waited longer
// than this between two steps is taken again.
const pgxPingAfter = time.Second

// TestLeaseStepsAreOneRoundTrip counts the round trips each lease step
// makes through a proxy, on each driver, after a warm-up (pgx prepares a
// statement once per connection).
func TestLeaseStepsAreOneRoundTrip(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1) // one connection: the warm-up warms the measured one
			store := Postgres().(*postgres).forDB(db)
			ctx := context.Background()
			req := backend.LeaseRequest{Kind: backend.KindLease, Name: testdb.UniqueName(t), Key: 1, Owner: "roundtrip", TTL: time.Minute}
			resource := testdb.UniqueName(t)
			var token uint64

			steps := []struct {
				name string
				run  func() (trips int64, err error)
			}{
				{"acquire", func() (int64, error) {
					return counted(proxy, func() error {
						var err error
						token, err = store.AcquireLease(ctx, db, req)
						return err
					})
				}},
				{"renew", func() (int64, error) {
					return counted(proxy, func() error {
						r := req
						r.Token = token
						_, err := store.RenewLease(ctx, db, r)
						return err
					})
				}},
				{"holder", func() (int64, error) {
					return counted(proxy, func() error {
						h, err := store.LeaseHolder(ctx, db, req)
						if err == nil && (h == nil || h.Token != token) {
							t.Fatalf("holder = %+v, want token %d", h, token)
						}
						return err
					})
				}},
				{"admit", func() (int64, error) {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return 0, err
					}
					defer tx.Rollback()
					trips, err := counted(proxy, func() error { _, err := store.AdmitToken(ctx, tx, resource, token); return err })
					if err != nil {
						return 0, err
					}
					return trips, tx.Commit()
				}},
				{"release", func() (int64, error) {
					return counted(proxy, func() error {
						r := req
						r.Token = token
						return store.ReleaseLease(ctx, db, r)
					})
				}},
			}
			for _, s := range steps { // warm-up; also creates the tables if needed
				if _, err := s.run(); err != nil {
					t.Fatalf("warm-up %s: %v", s.name, err)
				}
			}
			last := time.Now()
			for _, s := range steps {
				measureOneRoundTrip(t, s.name, &last, s.run)
			}
		})
	}
}

// counted runs fn and returns the round trips it made through proxy.
func counted(proxy *testdb.Proxy, fn func() error) (int64, error) {
	proxy.ResetCount()
	err := fn()
	return proxy.RoundTrips(), err
}

// measureOneRoundTrip runs step and asserts it made exactly one round
// trip. If more than pgxPingAfter passed since the previous step ended
// (*last), the pool may have pinged the connection it checked out, and the
// step is measured again.
func measureOneRoundTrip(t *testing.T, name string, last *time.Time, step func() (int64, error)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		trips, err := step()
		slow := time.Since(*last) >= pgxPingAfter
		*last = time.Now()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if trips == 1 {
			return
		}
		if !slow || attempt == 5 {
			t.Fatalf("%s made %d round trips, want 1", name, trips)
		}
		t.Logf("%s: %d round trips in a slow attempt; measuring again", name, trips)
	}
}

// TestLeaseLockTryLockAndReleaseAreOneRoundTripEach counts the same
// through the public API: the front end adds no statement of its own.
func TestLeaseLockTryLockAndReleaseAreOneRoundTripEach(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			l, err := NewLeaseLock(db, testdb.UniqueName(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var g *LeaseGuard
			lock := func() (int64, error) {
				return counted(proxy, func() error {
					var err error
					g, err = l.TryLock(ctx)
					return err
				})
			}
			release := func() (int64, error) {
				return counted(proxy, func() error { return g.Release(ctx) })
			}
			for _, step := range []func() (int64, error){lock, release} { // warm-up
				if _, err := step(); err != nil {
					t.Fatal(err)
				}
			}
			last := time.Now()
			measureOneRoundTrip(t, "TryLock", &last, lock)
			measureOneRoundTrip(t, "Release", &last, release)
		})
	}
}

// A query cut short by its context can come back from database/sql as no
// rows (lib/pq#874; seen with pgx in a network cut). A lease or holder
// statement's "no row" means held, free or lost, so run must turn it into
// an unknown outcome when the context ended, and leave it alone otherwise.
func TestNoRowsFromAnEndedContextIsNoAnswer(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	p := &postgres{params: true}
	ctx, cancel := context.WithCancel(context.Background())
	err := p.run(ctx, db, func(dbutil.Querier) error { cancel(); return sql.ErrNoRows })
	if errors.Is(err, sql.ErrNoRows) || !errors.Is(err, context.Canceled) {
		t.Fatalf("no rows from a statement whose context ended = %v, want an unknown outcome wrapping context.Canceled", err)
	}
	if err := p.run(context.Background(), db, func(dbutil.Querier) error { return sql.ErrNoRows }); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("no rows with the context alive = %v, want sql.ErrNoRows", err)
	}
}
