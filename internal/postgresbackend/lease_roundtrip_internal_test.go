package postgresbackend

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

// TestLeaseStepsAreOneRoundTrip counts the round trips each lease step
// makes through a proxy, on each driver, after a warm-up (pgx prepares a
// statement once per connection).
func TestLeaseStepsAreOneRoundTrip(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1) // one connection: the warm-up warms the measured one
			store := (&postgres{}).forDB(db)
			ctx := context.Background()
			req := backend.LeaseRequest{Kind: backend.KindLease, Name: testdb.UniqueName(t), Key: 1, Owner: "roundtrip", TTL: time.Minute}
			resource := testdb.UniqueName(t)
			var token uint64

			steps := []struct {
				name string
				run  func() (trips int64, err error)
			}{
				{"acquire", func() (int64, error) {
					return proxy.Counted(func() error {
						var err error
						token, err = store.AcquireLease(ctx, db, req)
						return err
					})
				}},
				{"renew", func() (int64, error) {
					return proxy.Counted(func() error {
						r := req
						r.Token = token
						_, err := store.RenewLease(ctx, db, r)
						return err
					})
				}},
				{"holder", func() (int64, error) {
					return proxy.Counted(func() error {
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
					trips, err := proxy.Counted(func() error { _, err := store.AdmitToken(ctx, tx, resource, token); return err })
					if err != nil {
						return 0, err
					}
					return trips, tx.Commit()
				}},
				{"release", func() (int64, error) {
					return proxy.Counted(func() error {
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
				testdb.MeasureOneRoundTrip(t, s.name, &last, s.run)
			}
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
