package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/advisorylock/advisorylock/backend"
)

// TryLockTx makes one attempt to take the lock in tx, the caller's
// transaction, and reports whether it did. A lock taken so is held by the
// transaction and released by its commit or rollback, not by the package:
// there is no Guard, no pinned connection and no keep-alive, and it works
// behind a transaction-mode pooler (PgBouncer pool_mode=transaction),
// where a Lock cannot. It excludes the other holders of the name: Lock,
// TryLock and the Do family of any process, and other transactions.
// Within one transaction it is re-entrant: a second take succeeds.
//
// Only PostgreSQL has transaction-scoped locks (pg_advisory_xact_lock):
// on other backends it returns an error matching ErrUnsupported, as it
// does for a Lock with WithMinHold (a transaction keeps no window). A
// server in recovery (a hot standby) is refused with ErrUnsupported too.
// tx must be a transaction on l's database.
//
// A miss leaves tx as it was. An error from the statement itself (the
// network, a transaction already aborted) leaves tx in whatever state
// that error left it. TryLockTx does not give ctx to the driver, which
// would cut the statement short and abort tx (lib/pq) or close its
// connection (pgx): it waits for the answer, which comes in one round
// trip.
//
// Keep such transactions short: a transaction holds a snapshot while it
// runs, which holds back vacuum and keeps CREATE INDEX CONCURRENTLY
// waiting, however long the lock is held.
func (l *Lock) TryLockTx(ctx context.Context, tx *sql.Tx) (bool, error) {
	err := l.lockTx(ctx, tx, "try lock in transaction", false)
	if errors.Is(err, ErrNotAcquired) {
		return false, nil
	}
	return err == nil, err
}

// LockTx takes the lock in tx, the caller's transaction, waiting until it
// is granted or ctx ends; commit or rollback releases it (see TryLockTx,
// which says what it excludes and where it works).
//
// The wait is server-side, in slices of about a second (or less, as ctx's
// deadline nears), each inside a savepoint bounded by the server's
// lock_timeout: a slice that ends without the lock is rolled back to its
// savepoint, and a slice that gets it is released into tx. So a wait
// that ends without the lock, on ctx's deadline or cancel, never aborts
// tx: LockTx returns ctx's error (within about a slice of a cancel, and
// of a deadline at once), and tx is usable, without the lock, and with
// its lock_timeout and statement_timeout as they were (a grant puts them
// back too). ctx is never given to the driver (see TryLockTx).
func (l *Lock) LockTx(ctx context.Context, tx *sql.Tx) error {
	return l.lockTx(ctx, tx, "lock in transaction", true)
}

// lockTx is TryLockTx (wait false) and LockTx, observed: a grant's
// release is reported at once (a commit releases it unseen: see
// Event.Kind).
func (l *Lock) lockTx(ctx context.Context, tx *sql.Tx, op string, wait bool) error {
	ctx, a := startAcquire(ctx, txObserved{l}, wait)
	err := wrapErr(l.name, op, l.takeTx(ctx, tx, wait))
	if a.ob != nil {
		h := &hold{name: l.name, key: l.key}
		a.end(h, err)
		if err == nil {
			h.observer().released("", nil)
		}
	}
	return err
}

// takeTx takes the lock in tx: one try, and with wait slices after.
func (l *Lock) takeTx(ctx context.Context, tx *sql.Tx, wait bool) error {
	if tx == nil {
		return errors.New("advisorylock: nil transaction")
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	b, err := l.txBackend(ctx)
	if err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sliceGrace)
	defer cancel()
	ok, err := b.TryLockTx(tctx, tx, l.key)
	switch {
	case err != nil:
		return err
	case ok:
		return nil
	case !wait:
		return ErrNotAcquired
	}
	prev, err := b.TxSettings(tctx, tx)
	if err != nil {
		return err
	}
	return l.waitTx(ctx, b, tx, prev)
}

// waitTx waits in slices until the lock is granted in tx or ctx ends;
// prev are tx's settings, which a slice puts back.
func (l *Lock) waitTx(ctx context.Context, b backend.TxLocker, tx *sql.Tx, prev map[string]string) error {
	for {
		slice, _, ok := nextSlice(ctx)
		if !ok {
			return context.Cause(ctx)
		}
		// The server ends the slice; the deadline is for a dead network.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), slice+sliceGrace)
		ok, err := b.WaitLockTx(sctx, tx, l.key, slice, prev)
		cancel()
		if err != nil || ok {
			return err
		}
	}
}

// txBackend returns l's backend for transaction locks, after the
// first-use checks but the pooler probe (a transaction lock needs no
// session of its own); LockTx is refused before anything is sent on a
// backend that is no TxLocker.
func (l *Lock) txBackend(ctx context.Context) (backend.TxLocker, error) {
	b, err := resolveBackend(ctx, l.db, &l.cfg)
	if err != nil {
		return nil, err
	}
	t, ok := b.(backend.TxLocker)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: backend %q has no transaction-scoped locks (LockTx needs PostgreSQL's pg_advisory_xact_lock); use Lock or LeaseLock", ErrUnsupported, b.Name())
	case l.cfg.minHold > 0:
		return nil, fmt.Errorf("%w: WithMinHold does not apply to a lock taken in a transaction (the window would end with it); use TryLock or TryDo", ErrUnsupported)
	}
	return t, nil
}

// txObserved is a Lock seen as its transaction locks (kind "transaction").
type txObserved struct{ l *Lock }

func (t txObserved) observed() *observed {
	return observedOf(nil, t.l.db, &t.l.cfg, kindTransaction, t.l.name, t.l.resolved)
}
