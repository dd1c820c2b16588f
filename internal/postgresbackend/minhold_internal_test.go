package postgresbackend

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// windowSession opens drv's PostgreSQL with the windows table ready, a
// connection of it (closed at cleanup) and a lock name (whose window row
// is deleted at cleanup).
func windowSession(t *testing.T, drv string) (*sql.DB, *postgres, *sql.Conn, string) {
	t.Helper()
	ctx := context.Background()
	db := testdb.OpenPostgres(t, drv)
	p := (&postgres{}).forDB(db)
	if err := p.PrepareWindows(ctx, db); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	name := testdb.UniqueName(t)
	t.Cleanup(func() { _, _ = db.Exec("DELETE FROM advisorylock_windows WHERE key = $1", keyOf(name)) })
	return db, p, conn, name
}

// TestClaimWindowLetsTheLockGoWhileAWindowIsOpen: a session granted the
// lock by a wait while another grant's window is open (a window recorded
// after the wait's snapshot) lets the lock go in the claim's statement;
// once no window is open, the claim records the session's own.
func TestClaimWindowLetsTheLockGoWhileAWindowIsOpen(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db, p, conn, name := windowSession(t, drv)
			key := keyOf(name)
			if _, err := db.Exec(`INSERT INTO advisorylock_windows VALUES ($1, $2, 0, 'other', NULL, now(), now() + interval '1 hour')`, key, name); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
				t.Fatal(err)
			}
			res, err := p.ClaimWindow(ctx, conn, key, name, time.Minute)
			if err != nil || res.OK {
				t.Fatalf("ClaimWindow in an open window = %+v, %v; want not OK", res, err)
			}
			if held, err := p.HoldsSession(ctx, conn, key); err != nil || held {
				t.Fatalf("after a refused claim the session holds the lock: %v, %v", held, err)
			}
			if left, err := p.WindowLeft(ctx, conn, key); err != nil || left < 59*time.Minute {
				t.Fatalf("WindowLeft = %v, %v; want about an hour", left, err)
			}

			if _, err := db.Exec("UPDATE advisorylock_windows SET taken_until = now() WHERE key = $1", key); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
				t.Fatal(err)
			}
			res, err = p.ClaimWindow(ctx, conn, key, name, time.Minute)
			if err != nil || !res.OK || res.Session == 0 {
				t.Fatalf("ClaimWindow with no window open = %+v, %v; want OK with the session", res, err)
			}
			h, err := p.WindowHolder(ctx, db, key)
			if err != nil || h == nil || h.PID != int(res.Session) || h.Name != name {
				t.Fatalf("WindowHolder = %+v, %v; want session %d's window on %q", h, err, res.Session, name)
			}
			if held, err := p.HoldsSession(ctx, conn, key); err != nil || !held {
				t.Fatalf("after its claim the session does not hold the lock: %v, %v", held, err)
			}
			if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTryLockSessionForLeavesNoLockInAnOpenWindow: a try in an open
// window reports a miss and leaves the session holding nothing.
func TestTryLockSessionForLeavesNoLockInAnOpenWindow(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			_, p, conn, name := windowSession(t, drv)
			key := keyOf(name)
			res, err := p.TryLockSessionFor(ctx, conn, key, name, time.Hour)
			if err != nil || !res.OK {
				t.Fatalf("first try = %+v, %v; want OK", res, err)
			}
			if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
				t.Fatal(err)
			}
			res, err = p.TryLockSessionFor(ctx, conn, key, name, time.Hour)
			if err != nil || res.OK {
				t.Fatalf("try in the window = %+v, %v; want a miss", res, err)
			}
			if held, err := p.HoldsSession(ctx, conn, key); err != nil || held {
				t.Fatalf("after a miss the session holds the lock: %v, %v", held, err)
			}
		})
	}
}
