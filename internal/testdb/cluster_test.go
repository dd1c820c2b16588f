package testdb

import (
	"context"
	"testing"
	"time"
)

func TestOwnClusterRestart(t *testing.T) {
	Slow(t, "server kill: restarts a private PostgreSQL")
	c := OwnCluster(t)
	if c.DSN == PostgresDSN(t) {
		t.Fatal("OwnCluster returned the shared server")
	}
	for _, driver := range Drivers {
		t.Run(driver, func(t *testing.T) {
			db := OpenPostgresDSN(t, driver, c.DSN)
			started := func() (time.Time, error) {
				var ts time.Time
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				err := db.QueryRowContext(ctx, "SELECT pg_postmaster_start_time()").Scan(&ts)
				return ts, err
			}
			before, err := started()
			if err != nil {
				t.Fatal(err)
			}
			c.Restart(t)
			var after time.Time
			// The pooled connection died with the old server; the pool
			// replaces it after at most a failed attempt or two.
			WaitFor(t, 0, func() bool {
				after, err = started()
				return err == nil
			}, "no answer after restart: %v", err)
			if !after.After(before) {
				t.Fatalf("start time %v not after %v: no restart happened", after, before)
			}
		})
	}
}

func TestOwnClusterStop(t *testing.T) {
	Slow(t, "starts and stops a private PostgreSQL")
	c := OwnCluster(t)
	c.Stop(t)
	if err := pingDSN(c.DSN); err == nil {
		t.Fatal("stopped cluster still answers")
	}
	c.Stop(t) // stopping twice is harmless
	c.Restart(t)
	if err := pingDSN(c.DSN); err != nil {
		t.Fatalf("restarted cluster: %v", err)
	}
}
