package postgresbackend

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Transaction-scoped locks (Lock.LockTx) on PostgreSQL:
// pg_advisory_xact_lock in the caller's transaction, which commit or
// rollback ends. The caller's transaction is never aborted by a wait that
// ends without the lock: each wait slice runs inside a savepoint, bounded
// by the server (lock_timeout for the wait, statement_timeout a little
// longer for the statement), never by a client-side cancel, which lib/pq
// turns into a broken connection and pgx into a closed socket.
//
// Checked on PostgreSQL 15: a lock taken inside a savepoint that is then
// released (RELEASE SAVEPOINT) stays held by the transaction, and one
// taken inside a savepoint that is rolled back (ROLLBACK TO) is freed with
// it; RELEASE keeps a SET LOCAL made inside the savepoint, ROLLBACK TO
// undoes it. So a slice that gets the lock restores the two settings it
// changed to the values read before the first slice, and a slice that ends without the
// lock (or is granted as its timeout fires) is rolled back, which undoes
// its settings and frees whatever it might have been granted. The try
// reads no settings: only a wait, after a miss, does.

const (
	// pgTryLockTx is the try. It does not try on a server in recovery
	// (NULL), where a lock excludes nothing on the primary.
	pgTryLockTx = `SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_try_advisory_xact_lock($1::bigint) END`
	// pgTxSettings reads the settings a wait changes, to put them back.
	pgTxSettings = `SELECT current_setting('statement_timeout'), current_setting('lock_timeout')`
	// pgWaitTx is one wait slice, one simple-protocol message: values in
	// order are the statement_timeout and lock_timeout of the slice (ms),
	// the key, and the statement_timeout and lock_timeout to restore (as
	// literals). When the lock statement fails, the statements after it
	// are skipped and the savepoint is left to pgUndoWaitTx.
	pgWaitTx = `SAVEPOINT advisorylock_locktx; SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d;
SELECT pg_advisory_xact_lock(%d); RELEASE SAVEPOINT advisorylock_locktx;
SELECT set_config('statement_timeout',%s, true), set_config('lock_timeout',%s, true)`
	// pgUndoWaitTx rolls back a slice that ended without the lock.
	pgUndoWaitTx = `ROLLBACK TO SAVEPOINT advisorylock_locktx; RELEASE SAVEPOINT advisorylock_locktx`
)

// TryLockTx tries pg_try_advisory_xact_lock in tx, one round trip; a miss
// leaves tx as it was. A server in recovery is refused with an error
// matching backend.ErrUnsupported.
func (p *postgres) TryLockTx(ctx context.Context, tx *sql.Tx, key int64) (bool, error) {
	q, args, err := p.statement(pgTryLockTx, key)
	if err != nil {
		return false, err
	}
	var ok sql.NullBool
	err = p.bound(ctx, func() error { return tx.QueryRowContext(p.quiet(ctx), q, args...).Scan(&ok) })
	switch {
	case err != nil:
		return false, err
	case !ok.Valid:
		return false, errStandby
	}
	return ok.Bool, nil
}

// TxSettings reads tx's statement_timeout and lock_timeout, one round
// trip (a wait's, after its try missed).
func (p *postgres) TxSettings(ctx context.Context, tx *sql.Tx) (map[string]string, error) {
	var stmt, lock string
	err := p.bound(ctx, func() error {
		return tx.QueryRowContext(p.quiet(ctx), pgTxSettings).Scan(&stmt, &lock)
	})
	return map[string]string{"statement_timeout": stmt, "lock_timeout": lock}, err
}

// WaitLockTx waits in pg_advisory_xact_lock for at most slice, inside a
// savepoint (see pgWaitTx). False means the slice ended without the lock
// and tx is as it was: the savepoint was rolled back, which undoes the
// settings it changed. A grant puts them back to prev.
//
// ctx bounds the wait for an answer on a dead network only: the
// statement's own end comes from the server's timeouts, and callers give
// a ctx that ends a grace after the slice. The driver gets it only where
// it ends a statement by itself (pgx); lib/pq's statements are bounded by
// bound, and get ctx without its end (see quiet).
func (p *postgres) WaitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev map[string]string) (bool, error) {
	stmt, err := quoteLiteral(prev["statement_timeout"])
	if err != nil {
		return false, err
	}
	lock, err := quoteLiteral(prev["lock_timeout"])
	if err != nil {
		return false, err
	}
	ms := max(slice.Milliseconds(), 1)
	q := fmt.Sprintf(pgWaitTx, ms+waitStatementSlack.Milliseconds(), ms, key, stmt, lock)
	err = p.bound(ctx, func() error {
		_, err := tx.ExecContext(p.quiet(ctx), q)
		return err
	})
	if code := dbutil.SQLState(err); code == "55P03" || code == "57014" {
		return false, p.bound(ctx, func() error {
			_, err := tx.ExecContext(p.quiet(ctx), pgUndoWaitTx)
			return err
		})
	}
	return err == nil, err
}

// quiet returns the context to give the driver for a statement that
// bound bounds: ctx where the driver ends a statement when ctx ends
// (pgx), else ctx without its end, so that lib/pq does not start a
// goroutine of its own per statement to send a cancel request (see
// pinned.quiet).
func (p *postgres) quiet(ctx context.Context) context.Context {
	if p.cancelsPromptly() {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
