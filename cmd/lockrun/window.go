package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Min-hold windows (--min-hold, the library's WithMinHold) keep a name
// taken until a while after each grant, also after its holder released
// it or died. Where a window lives depends on the database: on
// PostgreSQL and MySQL in a row of advisorylock_windows, which only a
// Lock with the option reads; on SQLite in the lock's own row, which
// every Lock reads. lockrun reads the window wherever it is, so that
// status shows it and a run without --min-hold is refused inside it on
// every backend (see sessionTarget.acquire).

// openWindow reports the min-hold window open on name (its ExpiresAt the
// window's end, the rest its last grant's holder), or nil when none is.
// On SQLite it is the lock's row once the lockrun that held it has
// exited: the row outlives its holder only for a window, or, for a holder
// killed without one, until its lease (--ttl) runs out. On PostgreSQL and
// MySQL it is the name's row of advisorylock_windows, read without
// creating the table: where it is missing, no Lock ever had a window.
func openWindow(ctx context.Context, db *database, name string) (*advisorylock.Holder, error) {
	key := advisorylock.Key(name)
	h := &advisorylock.Holder{Name: name}
	var application, user, addr string
	var err error
	switch db.kind {
	case "sqlite":
		return sqliteWindow(ctx, db, name)
	case "postgres":
		err = db.QueryRowContext(ctx, pgWindow, key).Scan(&h.PID, &application, &addr, &h.Since, &h.ExpiresAt)
	case "mysql":
		var since, until int64
		err = db.QueryRowContext(ctx, mysqlWindow+strconv.FormatInt(key, 10)).Scan(&h.PID, &user, &addr, &since, &until)
		h.Since, h.ExpiresAt = time.UnixMicro(since), time.UnixMicro(until)
	default:
		return nil, nil
	}
	h.Client = dbutil.Client(application, user, addr)
	switch {
	case errors.Is(err, sql.ErrNoRows), missingTable(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the min-hold window of lock %q: %w", name, err)
	}
	return h, nil
}

// The open window of a key on PostgreSQL and MySQL, by the database's
// clock (the library's WindowHolder, without its creating the tables).
const (
	pgWindow = `SELECT pid, application, coalesce(host(client_addr), ''), acquired_at, taken_until
FROM advisorylock_windows WHERE key = $1 AND taken_until > now()`
	mysqlWindow = `SELECT connection_id, user, host, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01', taken_until)
FROM advisorylock_windows WHERE taken_until > UTC_TIMESTAMP(6) AND lock_key = `
)

// sqliteWindow is the lock row of name on SQLite if its holder has exited.
func sqliteWindow(ctx context.Context, db *database, name string) (*advisorylock.Holder, error) {
	l, err := advisorylock.New(db, name, advisorylock.WithPoolerCheck(false))
	if err != nil {
		return nil, err
	}
	h, err := l.Holder(ctx)
	if h == nil || err != nil || lockKind(db, h) != "window" {
		return nil, err
	}
	return h, nil
}

// lockKind is the KIND of a Lock's holder h: "lock", "shared", or on
// SQLite "window" for an exclusive row whose holder, a process on this
// host, has exited (see openWindow). A holder lockrun cannot check (on
// another host, or not a lockrun) is taken to be alive.
func lockKind(db *database, h *advisorylock.Holder) string {
	if db.kind == "sqlite" && !h.Shared {
		if pid := ownerPID(h); pid != 0 && !processRunning(pid) {
			return "window"
		}
	}
	return kindOf(h)
}

// windowHolding is the status row of an open window on db, nil for none.
func windowHolding(db *database, w *advisorylock.Holder) *holding {
	if w == nil {
		return nil
	}
	r := db.row("window", advisorylock.Key(w.Name), *w)
	return &r
}

// errWindowOpen refuses a run without --min-hold inside a min-hold
// window: a conflict, as a lock held elsewhere.
var errWindowOpen = fmt.Errorf("a min-hold window is open: %w", advisorylock.ErrNotAcquired)

// The bounds of one sleep of a wait through a window: the window ends by
// the database's clock, which the host's may not match, so the wait asks
// again at least every windowPauseCeil, and at most every windowPauseFloor.
const (
	windowPauseFloor = 50 * time.Millisecond
	windowPauseCeil  = recheck
)

// sleepThroughWindow sleeps until window w ends, or at most windowPauseCeil,
// for an acquire that started at start with wait (< 0: no bound), and
// returns the wait left for the next attempt. When the bound ends first
// it sleeps to the bound and returns the timeout (advisorylock.ErrTimeout)
// a bounded wait ends with; when ctx ends, its cause.
func sleepThroughWindow(ctx context.Context, name string, w *advisorylock.Holder, start time.Time, wait time.Duration) (time.Duration, error) {
	pause := min(max(time.Until(w.ExpiresAt), windowPauseFloor), windowPauseCeil)
	timedOut := wait > 0 && wait-time.Since(start) <= pause
	if timedOut {
		pause = max(wait-time.Since(start), 0)
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	case <-t.C:
	}
	if wait < 0 {
		return wait, nil
	}
	left := wait - time.Since(start)
	if timedOut || left <= 0 {
		return 0, waitedOut(name, wait)
	}
	return left, nil
}
