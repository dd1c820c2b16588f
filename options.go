package advisorylock

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Option configures a Lock, LeaseLock, Semaphore, Election or Fence. A
// constructor refuses an option that does not apply to what it makes (say
// WithMinHold for a Semaphore) and a value outside the option's bounds,
// with an error naming the option: nothing is ignored or clamped.
type Option func(*config)

// clockFunc tells the time: WithClock's function, time.Now by default.
type clockFunc func() time.Time

// Now returns the time by c.
func (c clockFunc) Now() time.Time { return c() }

const (
	defaultLeaseTTL       = 30 * time.Second
	minLeaseTTL           = time.Second
	maxLeaseTTL           = 24 * time.Hour
	defaultPollInterval   = 20 * time.Millisecond
	minPollInterval       = time.Millisecond
	defaultKeepAlive      = 10 * time.Second
	defaultReleaseTimeout = 5 * time.Second
	defaultDeadHolder     = 20 * time.Second
	defaultPoolWait       = time.Second
	defaultRunRetention   = 7 * 24 * time.Hour
	defaultMultiplex      = 4 // shared sessions per handle: see WithMultiplexing
)

type config struct {
	backend        backend.Backend
	ttl            time.Duration
	poll           time.Duration
	pollSet        bool // by WithPollInterval (Election.Observe has its own default)
	keepAlive      time.Duration
	releaseTimeout time.Duration
	poolerCheck    bool
	serverChecks   bool
	logger         *slog.Logger
	clock          clockFunc
	owner          string
	observer       Observer // see WithObserver
	deadHolder     time.Duration
	deadHolderSet  bool // by WithDeadHolderTimeout; else derived (see check)
	poolWait       time.Duration
	minHold        time.Duration
	runRetention   time.Duration // see WithRunRetention
	multiplex      int           // see WithMultiplexing; 0: pinned
	leaseRows      bool          // see WithLeaseRows
	given          optionSet     // the options passed, for configFor
}

// optionSet is a set of options, one bit each, named in optionNames.
type optionSet uint32

const (
	optBackend optionSet = 1 << iota
	optLeaseTTL
	optPollInterval
	optKeepAlive
	optReleaseTimeout
	optPoolerCheck
	optServerChecks
	optLogger
	optClock
	optOwner
	optObserver
	optMinHold
	optDeadHolder
	optPoolWait
	optRunRetention
	optMultiplexing
	optLeaseRows

	// optAll is every option; each constructor takes optAll less what
	// cannot apply to it.
	optAll = optLeaseRows<<1 - 1
)

var optionNames = [...]string{"WithBackend", "WithLeaseTTL", "WithPollInterval", "WithKeepAlive",
	"WithReleaseTimeout", "WithPoolerCheck", "WithServerChecks", "WithLogger", "WithClock", "WithOwner",
	"WithObserver", "WithMinHold", "WithDeadHolderTimeout", "WithPoolWait", "WithRunRetention",
	"WithMultiplexing", "WithLeaseRows"}

// set records that an option was given.
func (c *config) set(o optionSet) { c.given |= o }

// configFor builds the configuration of a constructor that takes the
// options in takes, refusing one it does not take or one whose value is
// out of bounds (see check).
func configFor(what string, takes optionSet, opts []Option) (config, error) {
	c := newConfig(opts)
	given := c.given
	if c.multiplex == 0 {
		given &^= optMultiplexing // pinned, as every other kind is: see WithMultiplexing
	}
	for i, name := range optionNames {
		if o := optionSet(1) << i; given&o != 0 && takes&o == 0 {
			return c, fmt.Errorf("%w: %s does not apply to %s", errInvalidOption, name, what)
		}
	}
	return c, c.check(takes)
}

// errInvalidOption is what a constructor returns for an option it refuses.
var errInvalidOption = errors.New("advisorylock: invalid options")

func newConfig(opts []Option) config {
	c := config{
		ttl:            defaultLeaseTTL,
		poll:           defaultPollInterval,
		keepAlive:      defaultKeepAlive,
		releaseTimeout: defaultReleaseTimeout,
		poolerCheck:    true,
		serverChecks:   true,
		clock:          time.Now,
		deadHolder:     defaultDeadHolder,
		poolWait:       defaultPoolWait,
		runRetention:   defaultRunRetention,
	}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.clock == nil {
		c.clock = time.Now
	}
	return c
}

// multiplexByDefault gives a Lock made by New or NewSet the default
// number of shared sessions, unless WithMultiplexing was given or the
// Lock cannot multiplex (WithMinHold, WithLeaseRows; the backend is
// known at first use): see WithMultiplexing.
func (c *config) multiplexByDefault() {
	if c.given&optMultiplexing == 0 && c.minHold == 0 && !c.leaseRows {
		c.multiplex = defaultMultiplex
	}
}

func (c *config) log() *slog.Logger {
	if c.logger != nil {
		return c.logger
	}
	return slog.Default()
}

// WithBackend sets the backend instead of detecting it from db.Driver().
// It is required where the driver cannot be detected, such as go-sqlmock.
func WithBackend(b backend.Backend) Option {
	return func(c *config) { c.backend = b; c.set(optBackend) }
}

// WithLeaseTTL sets how long a lease lives without renewal [30s]; a d
// outside [1s, 24h] is refused. A holder renews every third of it, so a holder that
// dies frees the lock within one TTL.
func WithLeaseTTL(d time.Duration) Option { return func(c *config) { c.ttl = d; c.set(optLeaseTTL) } }

// WithPollInterval sets how often a waiter polls where the backend cannot
// wait server-side (SQLite, and LeaseLock everywhere) [20ms]; a d below
// 1ms is refused.
// A LeaseLock waiter starts at this interval and backs off, with jitter,
// to at most the larger of it and 500ms, so that many waiters do not
// flood the database; a lease released early is still seen within that.
//
// An Election's Observe polls Leader at this interval [1s without the
// option].
func WithPollInterval(d time.Duration) Option {
	return func(c *config) { c.poll, c.pollSet = d, true; c.set(optPollInterval) }
}

// WithKeepAlive sets how often a held PostgreSQL session lock checks that
// its session still holds it [10s]; 0 turns the check off, and then Lost
// only closes when the lock is released. A negative d is refused, and so
// is a d that, with the release timeout, reaches the dead-holder timeout
// (see WithDeadHolderTimeout): pass both. It does not apply to a
// LeaseLock or a Fence.
func WithKeepAlive(d time.Duration) Option {
	return func(c *config) { c.keepAlive = d; c.set(optKeepAlive) }
}

// WithReleaseTimeout bounds each release, which runs on its own context so
// that a caller whose context is already done still releases [5s]. On
// SQLite one statement that waits for a busy database waits as long as the
// driver's busy_timeout, which nothing can cut short: keep that below this.
// A d of 0 or less is refused. Without WithDeadHolderTimeout, a release
// timeout above 5s raises the default dead-holder timeout to the
// keep-alive plus the release timeout plus 5s.
func WithReleaseTimeout(d time.Duration) Option {
	return func(c *config) { c.releaseTimeout = d; c.set(optReleaseTimeout) }
}

// WithPoolerCheck turns the transaction-pooler probe (see DetectPooler)
// that a Lock on PostgreSQL runs at its first operation on or off [true].
// Turn it off only where you know no pooler multiplexes sessions;
// WithServerChecks(false) turns it off too.
func WithPoolerCheck(on bool) Option {
	return func(c *config) { c.poolerCheck = on; c.set(optPoolerCheck) }
}

// WithServerChecks turns on or off every check that the first operation
// on a *sql.DB runs against the server [true]: the backend's Validate
// (SQLite's in-memory check, PostgreSQL's look-alike check) and the
// pooler probe. Turn them off for go-sqlmock, which cannot answer them,
// or where you know the topology; a lock that skips them can be unsafe
// in exactly the ways they detect.
func WithServerChecks(on bool) Option {
	return func(c *config) { c.serverChecks = on; c.set(optServerChecks) }
}

// WithLogger sets the logger for warnings (lease lost, release failed,
// forgotten guard) [slog.Default()].
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l; c.set(optLogger) } }

// WithClock sets the clock that leases read the time from [time.Now]; nil
// keeps time.Now. Tests pass a fake clock's Now to drive lease expiry
// deterministically. It times the holder's own local deadline everywhere;
// on SQLite it is also the clock by which lease rows and min-hold windows
// expire and TryDoOnce's runs are recorded (on PostgreSQL and MySQL the
// database's clock decides those).
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.clock = now; c.set(optClock) }
}

// WithOwner sets a label that lease rows record as their owner, such as
// "host-a:4242", shown by Holder. A unique suffix is added per acquire, so
// two acquires never share an owner. [hostname:pid]
func WithOwner(label string) Option { return func(c *config) { c.owner = label; c.set(optOwner) } }

// WithMinHold keeps a Lock's or LeaseLock's name taken until d after each
// grant, also when the holder releases it sooner or dies [0: off]: during
// that window TryLock and TryDo report not acquired, Lock waits, and
// Holder shows the last holder with ExpiresAt at the window's end. It is
// what makes a short job that every replica's cron fires, a little apart,
// run once per tick (ShedLock's lockAtLeastFor). The window counts from
// the grant, by the database's clock on PostgreSQL (WithClock's on SQLite);
// a window counted from the release is not offered, see
// docs/cron.md. Every user of a name must use the same d. A
// Lock without it does not look for windows on PostgreSQL and MySQL (that
// would cost its try a second statement), so it takes the name inside
// one; on SQLite, where the window is the lock's own row, it finds the
// name taken. lockrun looks on every backend: a run without --min-hold
// inside an open window is refused (or waits) as for a held lock.
//
// A PostgreSQL Lock with it keeps its windows in a table,
// advisorylock_windows (created at the first operation, see Schema); its
// try still takes one round trip, and its release one. A backend that
// cannot keep windows makes the first operation fail with ErrUnsupported.
// A negative d is refused; the option does not apply to a Semaphore, an
// Election or a Fence.
func WithMinHold(d time.Duration) Option { return func(c *config) { c.minHold = d; c.set(optMinHold) } }

// WithRunRetention sets how long TryDoOnce remembers a run it recorded
// done [7 days]: a record older than d is deleted when the Lock records
// another run, after which the same run key would run again. Choose it
// longer than any replica can lag behind with a run key (a cron line's
// minute, a deploy's id). Below a minute it is refused; it applies to a
// Lock only.
func WithRunRetention(d time.Duration) Option {
	return func(c *config) { c.runRetention = d; c.set(optRunRetention) }
}

// WithMultiplexing sets how many pinned connections of its handle a
// Lock's session locks (PostgreSQL advisory locks, MySQL named locks)
// share with every Lock on it that has the same options, each session
// holding many locks [4]: a process holds thousands of names on a
// handful of connections. WithMultiplexing(0) pins one connection per
// held lock instead. A session lock is the same lock shared or pinned, so
// Locks with either setting exclude each other.
//
// TryLock (and TryDo, and the first attempt of every wait) runs on a
// shared session, one round trip; a second acquire of a name this
// process holds on a shared session is a miss without one. A wait that
// finds the name taken, or no connection for a new shared session within
// WithPoolWait, waits on a connection of its own, which then holds the
// lock as a pinned one. One keep-alive per session checks all its locks
// in one statement.
//
// The trade: a shared session that dies, or whose state a failed
// statement leaves unknown, loses every lock on it (each Guard's Lost
// closes, each Do's context is cancelled, each loss is told to the
// Observer), and no other. Statements on a shared session cannot be
// cancelled by a caller's context (that could cost the connection, and
// every lock on it): they are bounded by the release timeout instead.
// Guard.WithConn lends a shared session, and its other locks' statements
// wait for fn (see there); the deprecated Guard.Conn returns nil on it.
// Pin (WithMultiplexing(0)) a few long holds whose sessions should fail
// alone.
//
// Pool sizing: the shared sessions stay fewer than the handle's
// SetMaxOpenConns limit m (read at each try; a pool without a limit is
// not bounded): at most m-1 whatever sessions says, so that held locks
// leave the application's other statements a connection (with m = 1 the
// one session takes the pool's only connection while it holds a lock).
// Count sessions connections for all of a handle's multiplexed holds,
// plus one per pinned hold: a wait that found its name taken, a shared
// hold (RLock), a Semaphore's slot, a Lock with WithMinHold or
// WithMultiplexing(0).
//
// It applies to New and NewSet; every constructor takes
// WithMultiplexing(0), which asks nothing of the others, so that one list
// of options serves them all. Locks that cannot share a session stay
// pinned without an error when the option is not given: the shared side
// (RLock), WithMinHold, a backend given with WithBackend that does not
// support it (see package backend); on SQLite and with WithLeaseRows a
// Lock is a row and pins nothing. Given with sessions above 0, those are
// refused: with WithMinHold or WithLeaseRows at construction, RLock with
// ErrUnsupported, a backend that does not support it with ErrUnsupported
// at the first operation (SQLite is not refused: it changes nothing
// there). sessions below 0 is refused.
func WithMultiplexing(sessions int) Option {
	return func(c *config) { c.multiplex = sessions; c.set(optMultiplexing) }
}

// WithLeaseRows keeps the holds of a Lock, its shared side, a set
// (NewSet), a Semaphore and an Election on lease rows, as SQLite does,
// instead of session locks: on PostgreSQL in advisorylock_locks (an
// Election in advisorylock_leases, its term the lease's token), on MySQL
// and MariaDB likewise (see Schema). Every statement of a row is one
// autocommit round trip that pins no connection, so the holds work behind
// a transaction-mode pooler (PgBouncer pool_mode=transaction, Supavisor's
// transaction mode, Neon's -pooler host, RDS Proxy), where session locks
// are refused with ErrTransactionPooler; the pooler check is skipped.
// On a backend that keeps only rows (SQLite) it changes nothing.
//
// The trade, against session locks:
//   - the hold is renewed in the background every TTL/3 (WithLeaseTTL),
//     a statement each, and no connection is held in between;
//   - a holder that cannot renew believes its hold lost at a local
//     deadline (TTL less one renew interval, on its own clock) before the
//     database can grant it again: Guard.Lost closes and Do's context is
//     cancelled, with CauseExpired or CauseTakenOver;
//   - after a holder dies its row stays taken until the TTL runs out: a
//     waiter takes over within the TTL, not at once as when a session
//     ends (a Release frees the row at once);
//   - waiters poll (WithPollInterval, backing off toward the holder's
//     expiry) instead of waiting on the server;
//   - each grant gets a new row token; an Election's term is its lease's
//     FencingToken, larger than every earlier one.
//
// Rows and session locks of one name do not exclude each other: every
// process of a fleet must make the same choice for a name. The first
// operation picks rows where the backend keeps leases (every built-in
// backend does). A shared hold (RLock) is a row of its own with a token
// of its own, beside other shared holders and apart from an exclusive
// one, as on SQLite; WithMinHold keeps its window in the row. It applies to
// New, NewSet, NewSemaphore and NewElection, not with WithMultiplexing.
func WithLeaseRows() Option {
	return func(c *config) { c.leaseRows = true; c.set(optLeaseRows) }
}

// WithDeadHolderTimeout sets how soon PostgreSQL frees the session lock of
// a holder that vanished without closing its socket (a host powered off,
// a network blackhole) [20s; 0 leaves the server's settings, with which
// the kernel notices after about two hours]. Each pinned session gets TCP
// keepalive settings and a TCP user timeout that make the server end it
// within about d, in the same round trip as its first lock statement.
//
// d must exceed the keep-alive interval plus the release timeout, so that
// a holder cut off from the server notices the loss (Lost closes) before
// the server frees its lock; New refuses an option set that breaks this,
// and a negative d.
// Behind a proxy (PgBouncer, a cloud proxy) the server's keepalives reach
// the proxy, not the client, and this bounds nothing. On MySQL, given
// explicitly (not by default), it sets the session's wait_timeout to d
// (whole seconds) at its first grant, unless the keep-alive is off (see
// MySQL).
func WithDeadHolderTimeout(d time.Duration) Option {
	return func(c *config) { c.deadHolder, c.deadHolderSet = d, true; c.set(optDeadHolder) }
}

// WithPoolWait bounds how long an acquire waits for a connection from an
// exhausted pool before it fails with ErrPoolUnavailable [1s], so that
// TryLock and TryDo on a context without a deadline do not hang. A
// shorter deadline on the acquire's context still wins. A d of 0 or less
// is refused.
func WithPoolWait(d time.Duration) Option {
	return func(c *config) { c.poolWait = d; c.set(optPoolWait) }
}

// check refuses option values out of their bounds, and a keep-alive
// that does not fit under the dead-holder timeout where keep-alives apply
// (takes has optKeepAlive). Without WithDeadHolderTimeout the dead-holder
// timeout is its default, raised where a longer release timeout needs
// more; a WithKeepAlive that needs more is refused instead, so that the
// server's bound on a vanished holder never grows unasked.
func (c *config) check(takes optionSet) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errInvalidOption}, args...)...)
	}
	switch {
	case c.ttl < minLeaseTTL || c.ttl > maxLeaseTTL:
		return bad("WithLeaseTTL(%s) is outside [%s, %s]", c.ttl, minLeaseTTL, maxLeaseTTL)
	case c.poll < minPollInterval:
		return bad("WithPollInterval(%s) is below %s", c.poll, minPollInterval)
	case c.keepAlive < 0:
		return bad("WithKeepAlive(%s) is negative (0 turns the keep-alive off)", c.keepAlive)
	case c.releaseTimeout <= 0:
		return bad("WithReleaseTimeout(%s) must be positive", c.releaseTimeout)
	case c.poolWait <= 0:
		return bad("WithPoolWait(%s) must be positive", c.poolWait)
	case c.minHold < 0:
		return bad("WithMinHold(%s) is negative (0 turns it off)", c.minHold)
	case c.runRetention < time.Minute:
		return bad("WithRunRetention(%s) is below 1m", c.runRetention)
	case c.multiplex < 0:
		return bad("WithMultiplexing(%d) is negative (0 pins a session per held lock)", c.multiplex)
	case c.multiplex > 0 && c.minHold > 0:
		return bad("WithMultiplexing does not combine with WithMinHold")
	case c.multiplex > 0 && c.leaseRows:
		return bad("WithMultiplexing does not combine with WithLeaseRows (a lease row pins no session to share)")
	case c.deadHolder < 0:
		return bad("WithDeadHolderTimeout(%s) is negative (0 leaves the server's settings)", c.deadHolder)
	}
	if takes&optKeepAlive == 0 {
		return nil
	}
	if !c.deadHolderSet {
		if c.given&optKeepAlive != 0 && c.keepAlive+c.releaseTimeout >= defaultDeadHolder {
			return bad("WithKeepAlive(%s) plus the release timeout (%s) must stay below the dead-holder timeout (%s by default), so that a cut-off holder learns of its loss before the server frees its lock: pass WithDeadHolderTimeout above %s too",
				c.keepAlive, c.releaseTimeout, defaultDeadHolder, c.keepAlive+c.releaseTimeout)
		}
		c.deadHolder = max(defaultDeadHolder, c.keepAlive+c.releaseTimeout+defaultReleaseTimeout)
		return nil
	}
	if c.deadHolder > 0 && c.deadHolder <= c.keepAlive+c.releaseTimeout {
		return bad("WithDeadHolderTimeout(%s) must exceed the keep-alive interval (%s) plus the release timeout (%s), so that a cut-off holder learns of its loss before the server frees its lock",
			c.deadHolder, c.keepAlive, c.releaseTimeout)
	}
	return nil
}
