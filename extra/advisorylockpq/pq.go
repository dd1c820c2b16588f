// Package advisorylockpq wakes advisorylock's PostgreSQL LeaseLock
// waiters on lib/pq as soon as the lease they wait for is released.
//
// A LeaseLock waiter is woken by a notification that the release sends.
// pgx delivers notifications to a connection of database/sql's pool, and
// the library listens there; lib/pq hands them only to a pq.Listener, a
// connection of its own that the library cannot open from a *sql.DB, so
// on a plain lib/pq handle waiters poll (backing off to half a second).
// Wrap gives the handle what the library needs: a DB that runs a
// pq.Listener on the same DSN while waiters wait.
//
//	db, err := sql.Open("postgres", dsn)
//	...
//	lease, err := advisorylock.NewLeaseLock(advisorylockpq.Wrap(db, dsn), "nightly-report")
//
// Everything else works as on db itself: locks made from the wrapped
// handle and from db are the same locks. Behind a transaction-mode
// pooler (PgBouncer's pool_mode=transaction) the library does not listen
// and waiters poll, as they would without the wrapper.
package advisorylockpq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/lib/pq"
)

// DB is a lib/pq *sql.DB whose notifications reach the library through a
// pq.Listener (see backend.Notifier). It embeds the *sql.DB, so it
// is used wherever the handle is.
type DB struct {
	*sql.DB
	dsn string
}

var _ backend.Notifier = (*DB)(nil)

// Wrap returns db with a listener on dsn, which must name the server and
// database that db connects to (the DSN db was opened with). The
// listener's connection is opened only while LeaseLock waiters wait on
// the handle, and is closed after them; it is not one of db's pool.
func Wrap(db *sql.DB, dsn string) *DB { return &DB{DB: db, dsn: dsn} }

// Reconnect bounds of the listener: pq.Listener tries again after
// listenRetryMin, doubling up to listenRetryMax, when its connection
// fails. Waiters poll meanwhile.
const (
	listenRetryMin = 10 * time.Millisecond
	listenRetryMax = time.Second
)

// Listen implements backend.Notifier with a pq.Listener on the DSN:
// it listens on channel until ctx ends, calling ready once it listens and
// again after each reconnect (notifications sent while it was away are
// lost), and notify with each payload. It returns an error when the
// listener cannot LISTEN, or when it loses its connection: the library
// then listens again while waiters wait, and they poll meanwhile.
func (d *DB) Listen(ctx context.Context, channel string, ready func(), notify func(payload string)) error {
	lost := make(chan error, 1)
	l := pq.NewListener(d.dsn, listenRetryMin, listenRetryMax, func(ev pq.ListenerEventType, err error) {
		if ev == pq.ListenerEventDisconnected || ev == pq.ListenerEventConnectionAttemptFailed {
			select {
			case lost <- fmt.Errorf("advisorylockpq: listener on %q: %w", channel, orLost(err)):
			default:
			}
		}
	})
	defer l.Close()
	if err := l.Listen(channel); err != nil {
		return fmt.Errorf("advisorylockpq: LISTEN %s: %w", channel, err)
	}
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-lost:
			return err
		case n := <-l.Notify:
			if n == nil { // reconnected: what was sent meanwhile went unheard
				ready()
				continue
			}
			notify(n.Extra)
		}
	}
}

// orLost names a connection loss that pq reports without an error.
func orLost(err error) error {
	if err == nil {
		return errors.New("connection lost")
	}
	return err
}
