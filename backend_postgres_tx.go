package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"time"
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
// changed to the values the try read, and a slice that ends without the
// lock (or is granted as its timeout fires) is rolled back, which undoes
// its settings and frees whatever it might have been granted.

const (
	// pgTryLockTx is the try, which also reads the settings a wait would
	// change, so that it can put them back. It does not try on a server in
	// recovery (NULL), where a lock excludes nothing on the primary.
	pgTryLockTx = `SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_try_advisory_xact_lock($1::bigint) END,
	current_setting('statement_timeout'), current_setting('lock_timeout')`
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

// tryLockTx tries pg_try_advisory_xact_lock in tx, one round trip; a miss
// leaves tx as it was. It also returns the transaction's statement_timeout
// and lock_timeout, for waitLockTx to restore. A server in recovery is
// refused with an error matching ErrUnsupported.
func (p *postgres) tryLockTx(ctx context.Context, tx *sql.Tx, key int64) (txLockResult, error) {
	q, args, err := p.statement(pgTryLockTx, key)
	if err != nil {
		return txLockResult{}, err
	}
	var ok sql.NullBool
	var r txLockResult
	err = p.bound(ctx, func() error {
		return tx.QueryRowContext(ctx, q, args...).Scan(&ok, &r.StatementTimeout, &r.LockTimeout)
	})
	switch {
	case err != nil:
		return txLockResult{}, err
	case !ok.Valid:
		return txLockResult{}, errStandby
	}
	r.OK = ok.Bool
	return r, nil
}

// waitLockTx waits in pg_advisory_xact_lock for at most slice, inside a
// savepoint (see pgWaitTx). OK false means the slice ended without the
// lock and tx is as it was: the savepoint was rolled back, which undoes
// the settings it changed. prev holds the settings to restore after a
// grant, as tryLockTx read them.
//
// ctx bounds the wait for an answer on a dead network only: the
// statement's own end comes from the server's timeouts, and callers give
// a ctx that ends a grace after the slice.
func (p *postgres) waitLockTx(ctx context.Context, tx *sql.Tx, key int64, slice time.Duration, prev txLockResult) (txLockResult, error) {
	stmt, err := quoteLiteral(prev.StatementTimeout)
	if err != nil {
		return txLockResult{}, err
	}
	lock, err := quoteLiteral(prev.LockTimeout)
	if err != nil {
		return txLockResult{}, err
	}
	ms := max(slice.Milliseconds(), 1)
	q := fmt.Sprintf(pgWaitTx, ms+waitStatementSlack.Milliseconds(), ms, key, stmt, lock)
	err = p.bound(ctx, func() error {
		_, err := tx.ExecContext(ctx, q)
		return err
	})
	if code := sqlState(err); code == "55P03" || code == "57014" {
		err = p.bound(ctx, func() error {
			_, err := tx.ExecContext(ctx, pgUndoWaitTx)
			return err
		})
		return txLockResult{StatementTimeout: prev.StatementTimeout, LockTimeout: prev.LockTimeout}, err
	}
	if err != nil {
		return txLockResult{}, err
	}
	prev.OK = true
	return prev, nil
}
