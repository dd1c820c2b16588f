// Package advisorylock gives any database/sql application named,
// cluster-wide locks on the database it already has (PostgreSQL, MySQL or
// MariaDB, SQLite): run this exactly once across all replicas right now
// (TryDo), or serialize this section across the fleet (Do); readers
// beside each other and apart from writers (RLock: shared locks,
// as sync.RWMutex spells them). For a job
// that every replica's scheduler fires, a little apart, TryDoOnce runs it
// once per run key (the scheduled tick), recorded done in the database;
// or WithMinHold keeps the name taken for a window after each grant.
//
// A Lock on PostgreSQL is a session advisory lock held on a connection
// pinned for the whole hold, by default one whose session holds the
// locks of the handle's other Locks too (see WithMultiplexing; on MySQL
// and MariaDB a GET_LOCK named lock, see MySQL); on SQLite it is a renewed lease row in the application's
// database file. A LeaseLock is a lease row on any of them, and
// each grant carries a FencingToken that a Fence checks at the resource,
// so a holder that was paused or cut off cannot overwrite its successor.
//
// What can go wrong, and what the package does about it:
//
//   - A lock's connection is never returned to the pool while it holds a
//     lock: held Locks use at most 4 shared connections by default, plus
//     one per pinned hold (count them in SetMaxOpenConns; see
//     WithMultiplexing). A shared session that dies loses all its locks.
//   - A cancelled or failed acquire discards its connection, so the
//     server frees whatever it might have granted.
//   - A held lock whose session dies (killed, network cut, restart) closes
//     its Guard's Lost channel and cancels Do's context.
//   - Behind a transaction-mode pooler (PgBouncer pool_mode=transaction)
//     session locks cannot work; the first operation of a Lock refuses
//     them with ErrTransactionPooler. LeaseLock works there, and so does a
//     lock taken in your own transaction (Lock.LockTx, PostgreSQL).
//   - Constructors do no I/O, as sql.Open: what needs the database (the
//     backend of a wrapped driver, the pooler probe, SQLite's checks) runs
//     at the first operation, under its context, once per *sql.DB. Call
//     Check at start-up to fail early.
//
// An Election (NewElection) elects one leader among replicas on top of
// these locks: Run leads while this replica is leader, with a term that
// is a FencingToken.
// A Semaphore admits up to N holders of a name at once, each on a slot of
// its own that is a lock of the same kind as a Lock's.
//
// Locks are not fair (waiters are not served in arrival order), and a Lock
// is not a lease on PostgreSQL: it lasts exactly as long as its session.
//
// PostgreSQL, MySQL and SQLite are built in (Postgres, MySQL, SQLite),
// and picked from the handle's driver. Another database plugs in with
// WithBackend; package backend holds the contract such a backend
// implements.
package advisorylock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// DB is what a lock needs from a handle. *sql.DB and *sqlx.DB satisfy it.
type DB interface {
	Conn(ctx context.Context) (*sql.Conn, error)
	Driver() driver.Driver
}

// keyDomain separates the keys this package derives from keys that other
// tools pick by hand. It is part of the key derivation and never changes
// within v1.
const keyDomain = "advisorylock:v1"

// Key returns the 64-bit lock key for name: the first 8 bytes, read as a
// big-endian two's-complement integer, of SHA-256 over the domain
// "advisorylock:v1", one zero byte, and the name's bytes. It is pure and stable, so any language can
// compute the same key, for example in Python:
//
//	int.from_bytes(hashlib.sha256(b"advisorylock:v1\x00" + name.encode())
//	    .digest()[:8], "big", signed=True)
func Key(name string) int64 {
	h := sha256.New()
	h.Write([]byte(keyDomain))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

// Holder describes who holds a lock now, for operators and tools. The
// caller knows which lock it asked about (Key gives its key); what else
// is known depends on the backend and the kind of lock.
//
// Client is the holder's session as its server knows it, for people to
// read: the application name (PostgreSQL's application_name), then the
// database user and the address joined as user@address, each part left
// out when unknown. On PostgreSQL, which reports no user, it reads like
// "billing 10.0.0.7"; on MySQL, which reports no application, like
// "app@10.0.0.7:51234".
type Holder struct {
	Name      string       // the lock's name, where the backend stores it
	PID       int          // the server's session: PostgreSQL backend pid, MySQL connection id (not the holder's OS process); 0 if unknown
	Client    string       // the holder's application, user and address, as far as known (see above); "" if none is
	Owner     string       // lease owner label, if a lease
	Token     FencingToken // the lease's latest grant (see FencingToken), 0 for session locks
	Since     time.Time    // when the hold began (or an earlier bound)
	ExpiresAt time.Time    // zero for session locks
	Slot      int          // a semaphore holder's slot (see Semaphore.Holders); 0 otherwise
	Shared    bool         // a shared holder (RLock), not an exclusive one
}

// holderOf returns h, as a backend reported it, as a Holder; nil for nil.
func holderOf(h *backend.Holder) *Holder {
	if h == nil {
		return nil
	}
	return &Holder{
		Name: h.Name, PID: h.PID, Client: dbutil.Client(h.Application, h.User, h.ClientAddr),
		Owner: h.Owner, Token: FencingToken(h.Token), Since: h.Since, ExpiresAt: h.ExpiresAt,
		Slot: h.Slot, Shared: h.Shared,
	}
}

// holdersOf returns hs as Holders, with err.
func holdersOf(hs []*backend.Holder, err error) ([]*Holder, error) {
	if hs == nil {
		return nil, err
	}
	out := make([]*Holder, len(hs))
	for i, h := range hs {
		out[i] = holderOf(h)
	}
	return out, err
}

// Lock is a named lock. It is safe for concurrent use; every acquire takes
// its own hold, so two acquires of one Lock exclude each other, in one
// process as across processes.
type Lock struct {
	db    DB
	name  string
	key   int64
	cfg   config
	setup firstUse[lockBackend]
	obs   atomic.Pointer[observed] // see observed
	kind  string                   // what its events say it is: "lock", or "election"
	sobs  atomic.Pointer[observed] // shared holds' (see observedAs)
	// A set's (NewSet) keys and names, in key order; nil for one name.
	set      []int64
	setNames []string
}

// lockBackend is how a Lock locks, learnt at its first use.
type lockBackend struct {
	session backend.SessionLocker
	bounded bool
	rows    backend.LeaseStore
	windows backend.WindowedSessionLocker // with WithMinHold on a session backend
	claim   claim                         // what a session acquire takes (see claimOn)
	// shared is how the Lock takes shared holds (RLock): the same backend
	// in shared mode, nil where it has none; isShared marks that view.
	shared   *lockBackend
	isShared bool
	// With WithMultiplexing: muxed, the settings its sessions were
	// given (part of what Locks that share sessions have in common), and
	// the pool of a handle that cannot be shared (see newMuxPool).
	muxed      bool
	settings   sessionSettings
	privateMux *muxPool
}

// sessionSettings are what a Lock gave Configure (backend.Configurer).
type sessionSettings struct {
	deadHolder   time.Duration
	serverChecks bool
}

// backend returns the backend.Backend that b locks with.
func (b *lockBackend) backend() backend.Backend {
	if b.session != nil {
		return b.session
	}
	return b.rows
}

// New returns a Lock on name. Any string but "" is a valid name: only its Key
// reaches the database (and, on SQLite, the name as a bound value).
//
// New does no I/O, as sql.Open: it fails only for a nil db, an empty
// name, or an option value out of its bounds (see Option). The first
// operation that needs the database (or Check) picks the backend, from
// WithBackend, db.Driver()'s type, or by asking the database, and runs the
// first-use checks, once per *sql.DB: it returns ErrUnsupported for a
// driver it cannot detect or an in-memory SQLite database, and on
// PostgreSQL ErrTransactionPooler when a transaction-mode pooler
// multiplexes sessions (see DetectPooler, WithServerChecks).
func New(db DB, name string, opts ...Option) (*Lock, error) {
	cfg, err := constructed(db, name, "a Lock", lockOptions, opts)
	if err != nil {
		return nil, wrapErr(name, "new", err)
	}
	cfg.multiplexByDefault()
	return newLock(db, name, cfg, backend.KindLock), nil
}

// lockOptions are the options a Lock takes: all of them.
const lockOptions = optAll

// newLock returns a Lock of kind on name with cfg, checked.
func newLock(db DB, name string, cfg config, kind string) *Lock {
	return &Lock{db: db, name: name, key: Key(name), cfg: cfg, setup: newFirstUse[lockBackend](), kind: kind}
}

// constructed checks what every constructor is given (a db, a name, the
// options that what takes, with values in bounds) and returns the
// configuration.
func constructed(db DB, name, what string, takes optionSet, opts []Option) (config, error) {
	if isNil(db) {
		return config{}, errNilDB
	}
	if name == "" {
		return config{}, errEmptyName
	}
	return configFor(what, takes, opts)
}

// errEmptyName refuses an empty name: two unrelated callers that forgot
// to set one would share a lock.
var errEmptyName = errors.New("advisorylock: empty name")

// Check runs the first-use work now (see New), for a service that wants
// to fail at start-up, as PingContext does: a hot standby, a transaction
// pooler, CockroachDB and, with WithMinHold, a role that may not create
// or write the windows table are refused here as the first operation
// would refuse them. Later operations skip it.
func (l *Lock) Check(ctx context.Context) error {
	lb, err := l.backend(ctx)
	switch {
	case err != nil:
	case lb.windows != nil: // a session lock's windows live in a table
		err = checkTables(ctx, l.db, lb.session, "advisorylock_windows")
	case lb.rows != nil: // so do rows
		err = checkTables(ctx, l.db, lb.rows, "advisorylock_locks")
	}
	return wrapErr(l.name, "check", err)
}

// backend returns how l locks, doing the first-use work once.
func (l *Lock) backend(ctx context.Context) (*lockBackend, error) {
	return l.setup.get(ctx, func(ctx context.Context) (*lockBackend, error) {
		b, err := resolveBackend(ctx, l.db, &l.cfg)
		if err != nil {
			return nil, err
		}
		if s, ok := b.(backend.LeaseStore); ok && l.cfg.leaseRows { // see WithLeaseRows
			return l.rowsBackend(s)
		}
		switch b := b.(type) {
		case backend.SessionLocker:
			var settings sessionSettings
			if c, ok := b.(backend.Configurer); ok {
				d := l.cfg.deadHolder
				if b.Traits().EndsIdleSessions && (l.cfg.keepAlive <= 0 || !l.cfg.deadHolderSet) {
					d = 0 // see backend.Traits.EndsIdleSessions
				}
				settings = sessionSettings{deadHolder: d, serverChecks: l.cfg.serverChecks}
				s, ok := c.Configure(l.db, d, l.cfg.serverChecks).(backend.SessionLocker)
				if !ok {
					return nil, fmt.Errorf("%w: backend %q configured for a Lock is no SessionLocker", ErrUnsupported, b.Name())
				}
				b = s
			}
			if s, ok := b.(backend.SessionIdentifier); ok && l.cfg.poolerCheck && l.cfg.serverChecks {
				if err := dbutil.CheckPooler(ctx, l.db, s); err != nil {
					return nil, err // a transaction-mode pooler
				}
			}
			w, err := l.windowsFor(ctx, b)
			if err != nil {
				return nil, err
			}
			lb := &lockBackend{session: b, bounded: !b.Traits().CancelsPromptly, windows: w, settings: settings}
			lb.claim = l.claimOn(b, w)
			lb.shared = l.sharedView(lb)
			if l.cfg.multiplex > 0 {
				// By default only where the backend can (see
				// WithMultiplexing); asked for, it must.
				_, ok := b.(backend.MultiplexLocker)
				if !ok && l.cfg.given&optMultiplexing != 0 {
					return nil, fmt.Errorf("%w: backend %q cannot hold many locks on one session (WithMultiplexing)", ErrUnsupported, b.Name())
				}
				if ok {
					lb.muxed = true
					lb.privateMux = newMuxPool(l, lb)
				}
			}
			return lb, nil
		case backend.LeaseStore:
			return l.rowsBackend(b)
		}
		return nil, fmt.Errorf("%w: backend %q implements neither SessionLocker nor LeaseStore", ErrUnsupported, b.Name())
	})
}

// rowsBackend is how l locks where its holds are lease rows in s.
func (l *Lock) rowsBackend(s backend.LeaseStore) (*lockBackend, error) {
	if err := checkRowWindows(&l.cfg, s); err != nil {
		return nil, err
	}
	lb := &lockBackend{rows: s}
	lb.shared = l.sharedView(lb)
	return lb, nil
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// TryLock makes one attempt and returns a Guard, or an error matching
// ErrNotAcquired when the lock is held elsewhere. A done ctx returns its
// error without touching the pool; the pool checkout waits as long as ctx
// allows. If ctx ends during the acquire, even as the lock is granted, the
// acquire returns ctx's error and closes its connection, which frees the
// lock: a cancelled acquire never leaves a lock held.
func (l *Lock) TryLock(ctx context.Context) (*Guard, error) {
	return acquire(ctx, l, "try lock", false)
}

// Lock waits until it holds the lock or ctx ends. On PostgreSQL the wait
// is server-side, in slices of about a second so that no waiting statement
// holds a snapshot long enough to stall CREATE INDEX CONCURRENTLY or
// vacuum; a release lets a waiter in within about one round trip.
// Elsewhere it polls (WithPollInterval).
func (l *Lock) Lock(ctx context.Context) (*Guard, error) {
	return acquire(ctx, l, "lock", true)
}

// LockTimeout is Lock bounded by d, which covers the pool checkout and the
// wait. When d runs out it returns an error matching ErrTimeout (its
// message names the lock, d and how long it waited) no later than about
// one round trip after d, and the connection goes back to the pool. With
// d <= 0 it makes exactly one attempt, like TryLock.
func (l *Lock) LockTimeout(ctx context.Context, d time.Duration) (*Guard, error) {
	return acquireWithin(ctx, l, "lock", d)
}

// observed returns what l's exclusive holds' events need (nil: none).
func (l *Lock) observed() *observed { return l.observedAs(false) }

// observedAs is observed for an exclusive or a shared hold.
func (l *Lock) observedAs(shared bool) *observed {
	p, kind := &l.obs, l.kind
	if shared {
		p, kind = &l.sobs, backend.KindShared
	}
	return observedOf(p, l.db, &l.cfg, kind, l.name, l.resolved)
}

// resolved returns the backend l's first use picked, nil before it.
func (l *Lock) resolved() backend.Backend {
	if b := l.setup.v.Load(); b != nil {
		return b.backend()
	}
	return nil
}

// A front end is a kind of lock as acquire sees it: a Lock, its shared
// side (sharedSide), a Semaphore, a LeaseLock. acquire observes, checks
// the budget and names the lock in the error; take does the rest.
type frontEnd[G guarded] interface {
	observable
	// settings returns the lock's name and configuration.
	settings() (name string, cfg *config)
	// take acquires, once or (wait) until budget ends: budget (ctx, or
	// bounded by LockTimeout's d) bounds the checkout and the wait, never
	// a statement in flight (a cancelled statement costs the connection).
	take(ctx, budget context.Context, wait bool) (G, error)
}

// guarded is a held lock as the acquire core returns it.
type guarded interface{ hold() *hold }

// acquire is a front end's try (wait false) or wait until ctx ends; op
// names the operation in its error ("try lock", "rlock", ...).
func acquire[G guarded](ctx context.Context, f frontEnd[G], op string, wait bool) (G, error) {
	ctx, a := startAcquire(ctx, f, wait)
	name, cfg := f.settings()
	var g G
	err := context.Cause(ctx) // a done ctx never touches the pool
	if err == nil {
		g, err = f.take(ctx, poolBudget(ctx, cfg, wait), wait)
	}
	err = wrapErr(name, op, err)
	a.end(g.hold(), err)
	return g, err
}

// acquireWithin is a front end's wait bounded by d (one attempt when d <=
// 0): running out of d is an error matching ErrTimeout (timeoutErr).
func acquireWithin[G guarded](ctx context.Context, f frontEnd[G], op string, d time.Duration) (G, error) {
	wait := d > 0
	ctx, a := startAcquire(ctx, f, wait)
	name, cfg := f.settings()
	start, budget := time.Now(), ctx
	if wait {
		var cancel context.CancelFunc
		budget, cancel = context.WithTimeoutCause(ctx, d, errBudget)
		defer cancel()
	}
	var g G
	err := context.Cause(budget)
	if err == nil {
		g, err = f.take(ctx, poolBudget(budget, cfg, wait), wait)
	}
	if err != nil && ctx.Err() == nil && (errors.Is(err, ErrNotAcquired) || errors.Is(err, errBudget)) {
		err = timeoutErr(name, d, time.Since(start))
	} else {
		err = wrapErr(name, op, err)
	}
	a.end(g.hold(), err)
	return g, err
}

// poolBudget bounds a try's pool checkout by WithPoolWait.
func poolBudget(budget context.Context, cfg *config, wait bool) context.Context {
	if wait {
		return budget
	}
	return dbutil.WithPoolWait(budget, cfg.poolWait)
}

// errBudget is the cause of a LockTimeout budget running out.
var errBudget = errors.New("advisorylock: wait budget spent")

// settings returns l's name and configuration (see frontEnd).
func (l *Lock) settings() (string, *config) { return l.name, &l.cfg }

// take takes l exclusive (see frontEnd): on its rows, on a shared session
// (a wait that finds the lock taken then waits on a connection of its
// own: see multiplex.go), or on a session pinned for the hold.
func (l *Lock) take(ctx, budget context.Context, wait bool) (*Guard, error) {
	b, err := l.backend(budget)
	switch {
	case err != nil:
		return nil, err
	case b.rows != nil:
		return l.acquireRows(ctx, budget, b, wait)
	case b.muxed:
		// A wait that finds the name taken, or no connection for a
		// shared session within the pool wait, waits on a connection of
		// its own, as a pinned lock does.
		g, err := l.tryMux(ctx, budget, b)
		if !wait || !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrPoolUnavailable) {
			return g, err
		}
	}
	return acquireSession(ctx, budget, l, b, l.observedAs(false), b.claim, wait)
}

// A claim is what a session acquire takes (see DESIGN.md): keyClaim,
// windowClaim, setClaim, slotClaim. slot is the slot taken, 0 for a Lock.
type claim interface {
	// try makes one attempt; OK false is a definite miss.
	try(ctx context.Context, p *pinned) (slot int, res backend.SessionResult, err error)
	// wait waits until it holds the claim or budget ends (a miss).
	wait(ctx, budget context.Context, p *pinned) (slot int, res backend.SessionResult, err error)
	// leave lets go of what a missed wait left; an error discards.
	leave(ctx context.Context, p *pinned) error
	// held returns the Lock that a hold of slot stands for.
	held(slot int) *Lock
}

// acquireSession takes c on a connection pinned for the hold.
func acquireSession(ctx, budget context.Context, l *Lock, b *lockBackend, obs *observed, c claim, wait bool) (*Guard, error) {
	s := &sessionHold{locker: b.session, p: pinned{bounded: b.bounded, obs: obs}}
	poolWait := l.cfg.poolWait
	if wait {
		poolWait = 0 // a wait's checkout is bounded by its budget (LockTimeout) or ctx
	}
	cg, err := checkout(budget, l.db, &s.p, poolWait)
	if err != nil {
		return nil, err
	}
	defer cg.settle()
	// A wait tries first too: a free lock costs the one cheap statement,
	// and only a held one starts the server-side wait.
	actx, cancel := attemptContext(ctx, budget, 0)
	slot, res, err := c.try(actx, &s.p)
	cancel()
	if wait && err == nil && !res.OK {
		slot, res, err = c.wait(ctx, budget, &s.p)
	}
	if err != nil {
		return nil, whyFailed(ctx, budget, err)
	}
	if !res.OK {
		// A definite miss: the connection goes back to the pool, after a
		// wait once c has let go of what the wait may have left on the
		// session (if it cannot, the still armed guard discards it).
		if !wait {
			cg.recycle()
			return nil, ErrNotAcquired
		}
		if c.leave(ctx, &s.p) == nil {
			cg.recycle()
		}
		return nil, context.Cause(budget)
	}
	if ctx.Err() != nil {
		// Cancelled as it was granted: the caller has gone, and a driver
		// may have given up on the connection (lib/pq closes it). The
		// armed guard discards it, which frees the lock.
		return nil, context.Cause(ctx)
	}
	cg.take()
	s.l = c.held(slot)
	g := s.grant(res.Session)
	g.slot = slot
	return g, nil
}

// attemptContext bounds an attempt of an acquire on a dead network: a
// grace after the budget's end, else after bound where it is not 0.
func attemptContext(ctx, budget context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := budget.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(budgetGrace))
	}
	if bound > 0 {
		return context.WithTimeout(ctx, bound)
	}
	return ctx, func() {}
}

// keyClaim is a plain Lock's claim: its key (shared on a shared view).
type keyClaim struct {
	l *Lock
	s backend.SessionLocker
}

func (c keyClaim) try(ctx context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
		return c.s.TryLockSession(ctx, conn, c.l.key)
	})
	return 0, res, err
}

func (c keyClaim) wait(ctx, budget context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := waitSession(ctx, budget, c.s, p, c.l.key)
	return 0, res, err
}

func (c keyClaim) leave(ctx context.Context, p *pinned) error {
	return endWait(ctx, c.s, p, c.l.key, c.l.cfg.releaseTimeout)
}

func (c keyClaim) held(int) *Lock { return c.l }

// claimOn returns l's claim on s: a key, a window (w), or a set.
func (l *Lock) claimOn(s backend.SessionLocker, w backend.WindowedSessionLocker) claim {
	switch {
	case w != nil:
		return windowClaim{l, w}
	case l.set != nil:
		return setClaim{l, s}
	}
	return keyClaim{l, s}
}

// whyFailed puts first the cause of a context that ended, if one did.
func whyFailed(ctx, budget context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	if budget.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(budget), err)
	}
	return err
}

// maxSlice bounds each server-side wait: no waiting statement holds a
// snapshot for longer.
const maxSlice = time.Second

// sliceGrace is how long past its lock_timeout a waiting statement may
// run before the client gives up on it (a dead network); budgetGrace,
// past a LockTimeout budget's end.
const (
	sliceGrace  = 5 * time.Second
	budgetGrace = time.Second
)

// nextSlice returns the next server-side wait slice under budget, and
// the grace a dead network gets past it; false once budget has ended.
func nextSlice(budget context.Context) (slice, grace time.Duration, ok bool) {
	slice, grace = maxSlice, sliceGrace
	if dl, ok := budget.Deadline(); ok {
		slice, grace = min(slice, time.Until(dl)), budgetGrace
	}
	if slice <= 0 {
		<-budget.Done() // due now: let its cause be set
	}
	return slice, grace, budget.Err() == nil
}

// waitSession waits in slices until it holds key, or budget ends between
// slices (a definite miss: OK false, nil error).
func waitSession(ctx, budget context.Context, session backend.SessionLocker, p *pinned, key int64) (backend.SessionResult, error) {
	for {
		slice, grace, ok := nextSlice(budget)
		if !ok {
			return backend.SessionResult{}, nil
		}
		sctx, cancel := context.WithTimeout(ctx, slice+grace)
		res, err := askWaiting(sctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return session.WaitLockSession(ctx, conn, key, slice)
		})
		cancel()
		if err != nil || res.OK {
			return res, err
		}
	}
}

// Holder reports who holds the lock now, or nil when it is free: the
// exclusive holder, or one of its shared holders (Shared set; Holders
// lists them all). With WithMinHold, a name kept taken by a grant's
// window reports that grant, with ExpiresAt at the window's end.
func (l *Lock) Holder(ctx context.Context) (*Holder, error) {
	b, err := l.backend(ctx)
	if err != nil {
		return nil, wrapErr(l.name, "holder", err)
	}
	for _, one := range l.members() {
		if h, err := one.holderOn(ctx, b); h != nil || err != nil {
			return h, wrapErr(l.name, "holder", err)
		}
	}
	return nil, nil
}

// holderOn reports the holder of l's one name on b, nil when it is free.
func (l *Lock) holderOn(ctx context.Context, b *lockBackend) (*Holder, error) {
	var h *backend.Holder
	var err error
	if b.rows != nil {
		h, err = b.rows.LeaseHolder(ctx, l.db, l.rowRequest(""))
	} else if h, err = l.windowHolder(ctx, b); h == nil && err == nil {
		h, err = b.session.SessionHolder(ctx, l.db, l.key)
	}
	if h != nil {
		h.Name, h.Key = l.name, l.key
	}
	return holderOf(h), err
}

// Do waits for the lock (as Lock does), runs fn, and releases the lock when
// fn returns, fails or panics. Do serializes: every caller runs fn, one at
// a time. fn's context is cancelled, with cause ErrLockLost, if the lock is
// lost while fn runs; Do then returns an error matching ErrLockLost unless
// fn returned an error of its own. A lock already lost when fn would
// start (a lease row whose grant came back past its local deadline, or
// whose deadline passed before fn's turn) does not run fn: Do returns an
// error matching ErrLockLost. Otherwise Do returns fn's error, or the
// release's.
func (l *Lock) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, l.name, l.Lock, fn)
}

// DoTimeout is Do with the wait bounded as in LockTimeout.
func (l *Lock) DoTimeout(ctx context.Context, d time.Duration, fn func(ctx context.Context) error) error {
	return do(ctx, l.name, func(ctx context.Context) (*Guard, error) { return l.LockTimeout(ctx, d) }, fn)
}

// TryDo runs fn only if it can take the lock at once: run-once across the
// fleet. It returns (false, nil) when the lock is held elsewhere, (false,
// an error matching ErrLockLost) when the lock was lost as it was granted
// (see Do), and otherwise (true, the error Do would return).
func (l *Lock) TryDo(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	return tryDo(ctx, l.name, l.TryLock, fn)
}

// section is a held lock that runs fn and then releases (Guard.run).
type section[F any] interface {
	run(ctx context.Context, fn F) (ran bool, err error)
}

// do acquires and runs fn under the guard; a nil fn is refused first.
func do[G section[F], F any](ctx context.Context, name string, acquire func(context.Context) (G, error), fn F) error {
	if isNilFunc(fn) {
		return wrapErr(name, "do", errNilFunc)
	}
	g, err := acquire(ctx)
	if err != nil {
		return err
	}
	_, err = g.run(ctx, fn)
	return err
}

// tryDo is do with one attempt: (false, nil) when the lock is held
// elsewhere; (false, the loss) when the grant was lost as it came.
func tryDo[G section[F], F any](ctx context.Context, name string, acquire func(context.Context) (G, error), fn F) (bool, error) {
	if isNilFunc(fn) {
		return false, wrapErr(name, "try do", errNilFunc)
	}
	g, err := acquire(ctx)
	if errors.Is(err, ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return g.run(ctx, fn)
}

// errNilFunc refuses a nil function given to a Do.
var errNilFunc = errors.New("advisorylock: nil function")

// isNilFunc reports whether fn, a function, is nil.
func isNilFunc[F any](fn F) bool {
	v := reflect.ValueOf(fn)
	return v.Kind() == reflect.Func && v.IsNil()
}

// Guard is a held lock (a Lock's, exclusive or shared, or a Semaphore's
// slot). Release it when done; Release is idempotent and safe for
// concurrent use. A Guard that becomes unreachable without Release is
// cleaned up by the garbage collector (its connection closed,
// which frees the lock, and a warning logged), but that may take long:
// always Release.
type Guard struct {
	h    *hold
	slot int // a Semaphore's slot; 0 for every other lock
}

// hold is a Guard's state; it never points back at its Guard.
type hold struct {
	name   string
	key    int64
	logger *slog.Logger
	relTO  time.Duration
	end    holdEnd

	mu       sync.Mutex // serializes the release and the cleanup
	released bool

	lostMu    sync.Mutex
	lostCh    chan struct{} // made on first use: most holds are never asked
	isGone    bool
	lostErr   error
	lostCause Cause        // why, for the Observer ("" if not told)
	lostFunc  func(error)  // called by lose (see onLost)
	obs       holdObserved // set once the acquire has returned; zero without an Observer
}

// holdEnd frees a hold: release within timeout; forget without I/O.
type holdEnd interface {
	release(ctx context.Context, timeout time.Duration) error
	forget()
}

// deadlineEnd is a holdEnd whose hold ends at a local deadline (a lease,
// lease rows): expireIfPast marks it lost once that has passed.
type deadlineEnd interface {
	expireIfPast()
}

// checkDeadline marks the hold lost if it ends at a local deadline that
// has passed, also when no goroutine has noticed yet: what Lost and run
// promise. The method's name is not deadlineEnd's, so that a holdEnd
// that embeds a hold does not answer to it.
func (h *hold) checkDeadline() {
	if e, ok := h.end.(deadlineEnd); ok {
		e.expireIfPast()
	}
}

func newGuard(h *hold) *Guard {
	g := &Guard{h: h}
	runtime.AddCleanup(g, (*hold).forgotten, h)
	return g
}

// hold returns g's hold, nil for a nil g.
func (g *Guard) hold() *hold {
	if g == nil {
		return nil
	}
	return g.h
}

// Slot returns the slot that a Semaphore's guard holds, from 0 to
// its slots-1, held by no other holder of the semaphore at the same time.
// It returns 0 for every other guard (a Lock's, a shared hold's).
func (g *Guard) Slot() int { return g.slot }

// Lost returns a channel that is closed when the guard no longer protects
// anything: the lock is known lost (its session is gone, or its lease row
// expired or was taken over), or the guard was released (Release, or the
// cleanup of a forgotten guard). A release is not a loss: Do still returns
// fn's result for a section that ended normally. A lock kept as a lease
// row reads lost from its local deadline on, even before a goroutine of
// the library notices (see Lease.Lost).
func (g *Guard) Lost() <-chan struct{} {
	g.h.checkDeadline()
	return g.h.lost()
}

// Release frees the lock. It runs on its own context bounded by
// WithReleaseTimeout, keeping only ctx's values, so a caller whose context
// is already done still releases. If the release statement fails the
// connection is discarded, which frees a session lock anyway, and the error
// is returned. Releasing a guard already known lost returns nil (there is
// nothing left to free; a session's connection is discarded), so a caller
// that must know whether its section kept the lock to the end checks Lost
// before Release (Lost closes on Release too), or uses Do, whose error
// reports the loss. Second and later calls return nil.
func (g *Guard) Release(ctx context.Context) error {
	err := g.h.doRelease(ctx)
	runtime.KeepAlive(g)
	return err
}

func (h *hold) doRelease(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	h.released = true
	defer h.markReleased()
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	err := wrapErr(h.name, "release", h.end.release(ctx, h.relTO))
	h.observer().released("", err)
	return err
}

// forgotten runs when a Guard became unreachable without Release.
func (h *hold) forgotten() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	defer h.markReleased()
	h.warn("advisorylock: guard was never released; freeing the lock", "lock", h.name, "key", h.key)
	h.end.forget()
	h.observer().released(CauseForgotten, nil)
}

// warn logs a warning about the hold.
func (h *hold) warn(msg string, args ...any) { h.logger.Warn(msg, args...) }

// lost returns the channel that lose closes.
func (h *hold) lost() <-chan struct{} {
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	if h.lostCh == nil {
		h.lostCh = make(chan struct{})
		if h.isGone {
			close(h.lostCh)
		}
	}
	return h.lostCh
}

// lose marks the hold lost once, and tells the Observer a non-"" cause.
func (h *hold) lose(cause Cause, err error) {
	h.lostMu.Lock()
	if !h.gone() {
		h.lostMu.Unlock()
		return
	}
	h.lostErr, h.lostCause = err, cause
	f, w := h.lostFunc, h.obs
	h.lostMu.Unlock()
	if cause != "" {
		w.lost(cause, err)
	}
	if f != nil {
		f(err)
	}
}

// observer returns what the hold's events need; zero without an Observer.
func (h *hold) observer() holdObserved {
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	return h.obs
}

// markReleased closes the lost channel of a released hold: it protects
// nothing any more. Unlike lose it records no error (a release is not
// a loss) and calls no onLost function.
func (h *hold) markReleased() {
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	h.gone()
}

// gone marks the hold gone and closes its lost channel, under lostMu;
// false if it was gone already.
func (h *hold) gone() bool {
	if h.isGone {
		return false
	}
	h.isGone = true
	if h.lostCh != nil {
		close(h.lostCh)
	}
	return true
}

// onLost makes lose call f, which must not block, with its error (at
// once if lost already), until onLost(nil): how Do cancels fn's context.
func (h *hold) onLost(f func(error)) {
	h.lostMu.Lock()
	h.lostFunc = f
	gone, why := h.isGone, h.lostErr
	h.lostMu.Unlock()
	if gone && f != nil {
		f(why)
	}
}

// isLost reports whether lose ran, and with what.
func (h *hold) isLost() (bool, error) {
	h.lostMu.Lock()
	defer h.lostMu.Unlock()
	return h.isGone, h.lostErr
}

// run runs fn under the guard and releases it afterwards, also when fn
// panics (the release runs as the panic unwinds), and reports whether fn
// ran. A guard already lost when it is handed over does not run fn: run
// returns the loss. So does a lease whose local deadline passed since its
// grant (a grant that arrived late, or a caller held up after it), though
// no goroutine has noticed yet.
func (g *Guard) run(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	g.h.checkDeadline()
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, guardKey{}, g))
	g.h.onLost(cancel)
	defer func() {
		g.h.onLost(nil)
		cancel(nil)
		relErr := g.Release(ctx)
		// A lost hold has a cause; a released one (our own release) has
		// none and is no loss.
		if _, why := g.h.isLost(); why != nil && (err == nil || errors.Is(err, context.Canceled)) {
			err = wrapErr(g.h.name, "run", why)
		} else if err == nil {
			err = relErr
		}
	}()
	if _, why := g.h.isLost(); why != nil {
		return false, nil // the deferred release returns the loss
	}
	return true, fn(fctx)
}
