package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// releaseWatch fans out the releases one listener hears (see
// backend.ReleaseListener) to the waiters of one *sql.DB: those of the
// key released, and all when the listener (re)starts or stops. A wake
// only makes a waiter try at once; the row still decides. The listener
// runs while waiters are joined and listenLinger after; a failed one
// starts again after listenRetry; where the store cannot listen on db
// (ErrUnsupported) the watch is off for good and waiters poll.
type releaseWatch struct {
	store backend.LeaseStore
	db    DB

	mu      sync.Mutex
	waiters map[*leaseWaiter]struct{}
	running bool               // the listener goroutine runs
	off     bool               // the store cannot listen on db
	stop    context.CancelFunc // ends the current listen; nil between listens
	linger  *time.Timer        // stops the listener once no waiter is left
}

// leaseWaiter is one waiting acquire; wake keeps at most one signal for
// its next wait. A waiter in line (owner set; see waitInLine) also learns
// whether a release handed the lease to it (granted) or to another
// (passed).
type leaseWaiter struct {
	w       *releaseWatch
	key     int64
	owner   string
	wake    chan struct{}
	granted bool // guarded by w.mu
	passed  bool // guarded by w.mu
}

const (
	// listenLinger is how long a listener stays after its last waiter.
	listenLinger = 250 * time.Millisecond
	// listenRetry is the pause before a failed listener starts again.
	listenRetry = 100 * time.Millisecond
	// listenCheckout bounds the listener's checkout: a busy pool must not
	// queue it ahead of the waiters' statements.
	listenCheckout = time.Second
	// listenMinPool is the smallest SetMaxOpenConns limit a listener takes
	// a connection from (it keeps one for as long as waiters wait).
	listenMinPool = 4
)

// sparesAConn reports whether db's pool can spare a connection while
// waiters wait: one not limited below listenMinPool.
func sparesAConn(db DB) bool {
	n := dbutil.MaxOpenConns(db)
	return n == 0 || n >= listenMinPool
}

// errNoReleaseSignals: the store's releases signal nothing.
var errNoReleaseSignals = fmt.Errorf("%w: the store signals no lease releases", ErrUnsupported)

// joinReleases registers a waiter for key on db's watch; nil where
// releases cannot be heard (the waiter polls). owner is the waiter's label
// where it queues (see waitInLine), else "". A listener that runs (one
// lingers after a wait) tells the waiter from now on; where none runs,
// the waiter starts one (see listen) once it is about to wait.
func joinReleases(ctx context.Context, store backend.LeaseStore, db DB, key int64, owner string) *leaseWaiter {
	if _, ok := store.(backend.ReleaseListener); !ok {
		return nil
	}
	if _, own := db.(backend.Notifier); !own && !sparesAConn(db) {
		return nil
	}
	w, err := dbutil.CachedVerdict(ctx, db, "release watch", func(context.Context) (*releaseWatch, error) {
		return &releaseWatch{store: store, db: db, waiters: map[*leaseWaiter]struct{}{}}, nil
	})
	if err != nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.off {
		return nil
	}
	lw := &leaseWaiter{w: w, key: key, owner: owner, wake: make(chan struct{}, 1)}
	w.waiters[lw] = struct{}{}
	if w.linger != nil {
		w.linger.Stop()
		w.linger = nil
	}
	return lw
}

// listen starts the watch's listener if none runs. A waiter calls it
// when its acquire missed, not when it joins: an acquire that needs no
// wait then opens no listener (a connection of the pool and a LISTEN for
// nothing; through go-sqlmock, a connection the expected statements
// need). A release before the listener listens goes unheard: the waiter
// polls, as it does for any signal lost.
func (lw *leaseWaiter) listen() {
	if lw == nil {
		return
	}
	w := lw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.running && !w.off {
		w.running = true
		go w.run()
	}
}

// leave unregisters the waiter; the last one to leave starts the linger.
func (lw *leaseWaiter) leave() {
	w := lw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.waiters, lw)
	if len(w.waiters) > 0 || !w.running || w.linger != nil {
		return
	}
	w.linger = time.AfterFunc(listenLinger, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.linger = nil
		if len(w.waiters) == 0 && w.stop != nil {
			w.stop()
		}
	})
}

// run listens until no waiter is left, starting again after a failure.
func (w *releaseWatch) run() {
	for {
		ctx, cancel := context.WithCancel(context.Background())
		w.mu.Lock()
		if len(w.waiters) == 0 { // all left during the pause
			w.running = false
			w.mu.Unlock()
			cancel()
			return
		}
		w.stop = cancel
		w.mu.Unlock()
		err := w.listen(ctx)
		stopped := ctx.Err() != nil // by the linger
		cancel()
		w.mu.Lock()
		w.stop = nil
		if errors.Is(err, ErrUnsupported) {
			w.off = true
		}
		off := w.off
		if off {
			w.running = false
		}
		w.mu.Unlock()
		w.wake(nil, "") // it heard nothing from here on (and, off, never will: a woken waiter sees it so)
		if off {
			return
		}
		if stopped {
			continue // the loop's check ends it, unless a waiter came back
		}
		time.Sleep(listenRetry) // a pause, not a synchronization: the server refused or cut the listener
	}
}

// listen runs one listener on a connection of its own, discarded after
// (never back to the pool listening); a backend.Notifier keeps its own.
func (w *releaseWatch) listen(ctx context.Context) error {
	wake := func() { w.wake(nil, "") }
	granted := func(key int64, grantee string) { w.wake(&key, grantee) }
	released := func(key int64) { w.wake(&key, "") }
	var conn *sql.Conn // nil for a backend.Notifier
	if _, ok := w.db.(backend.Notifier); !ok {
		checkout, cancel := context.WithTimeout(ctx, listenCheckout)
		c, err := w.db.Conn(checkout)
		cancel()
		if err != nil {
			return err
		}
		defer dbutil.Discard(c)
		conn = c
	}
	if q, ok := w.store.(backend.LeaseQueuer); ok {
		return q.ListenGrants(ctx, w.db, conn, wake, granted)
	}
	if l, ok := w.store.(backend.ReleaseListener); ok {
		return l.ListenReleases(ctx, w.db, conn, wake, released)
	}
	return errNoReleaseSignals
}

// isOff reports whether the watch is off for good.
func (w *releaseWatch) isOff() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.off
}

// wake signals the waiters for *key (all for nil), marking granted the
// one whose owner is grantee and passed the others (no grantee unmarks).
func (w *releaseWatch) wake(key *int64, grantee string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for lw := range w.waiters {
		if key != nil && lw.key != *key {
			continue
		}
		switch {
		case grantee == "":
			lw.passed = false
		case lw.owner == grantee:
			lw.granted = true
		default:
			lw.passed = true
		}
		select {
		case lw.wake <- struct{}{}:
		default:
		}
	}
}

// wakes is the waiter's wake channel; nil (never ready) for no waiter.
func (lw *leaseWaiter) wakes() <-chan struct{} {
	if lw == nil {
		return nil
	}
	return lw.wake
}

// heard returns the waiter's granted and passed (see leaseWaiter).
func (lw *leaseWaiter) heard() (granted, passed bool) {
	if lw == nil {
		return false, false
	}
	lw.w.mu.Lock()
	defer lw.w.mu.Unlock()
	return lw.granted, lw.passed
}
