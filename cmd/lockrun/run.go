package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/glebarez/go-sqlite"
	"github.com/jackc/pgx/v5/pgconn"
)

// recheck is how often a verbose waiter looks again for a new holder.
const recheck = 5 * time.Second

// target is the lock lockrun takes: a session Lock or a LeaseLock.
type target interface {
	// acquire takes the lock: one attempt when wait is 0, as long as it
	// takes when wait < 0, else for at most wait.
	acquire(ctx context.Context, wait time.Duration) (*held, error)
	// holder reports what keeps the lock from lockrun, as a row of the
	// status table (kind "window" for an open min-hold window); nil when
	// nothing does.
	holder(ctx context.Context) (*holding, error)
}

// held is a held lock.
type held struct {
	lost    <-chan struct{}
	token   advisorylock.FencingToken // 0 unless a lease
	env     []string                  // more variables for the command (LOCKRUN_SLOT)
	release func(context.Context) error
}

type sessionTarget struct {
	l      *advisorylock.Lock
	db     *database
	names  []string // the names l locks: one, or a set's (whose windows are each its own)
	shared bool     // -s: RLock instead of Lock
	// gated is set where the Lock does not see min-hold windows itself:
	// without --min-hold on PostgreSQL and MySQL, whose windows live in a
	// table that only a Lock with WithMinHold reads. On SQLite the window
	// is the lock's own row, which keeps every Lock out.
	gated bool
}

// holder reports the open min-hold window on a name, else the lock's
// holder (for a set, of the first name someone holds).
func (t sessionTarget) holder(ctx context.Context) (*holding, error) {
	w, err := t.window(ctx)
	if w != nil || err != nil {
		return windowHolding(t.db, w), err
	}
	h, err := t.l.Holder(ctx)
	if h == nil || err != nil {
		return nil, err
	}
	r := t.db.row(lockKind(t.db, h), advisorylock.Key(h.Name), *h)
	return &r, nil
}

// acquire takes the lock as wait says. A gated lock granted inside a
// min-hold window lets it go again at once: with no wait that is a
// conflict (errWindowOpen), as on SQLite; a wait goes on until the
// window's end, by the database's clock (see sleepThroughWindow). The
// check follows the grant, so it also sees a window recorded while
// lockrun waited: windows are recorded by grants, and none can follow
// lockrun's until lockrun releases.
func (t sessionTarget) acquire(ctx context.Context, wait time.Duration) (*held, error) {
	try, lock, lockTimeout := t.l.TryLock, t.l.Lock, t.l.LockTimeout
	if t.shared {
		try, lock, lockTimeout = t.l.TryRLock, t.l.RLock, withDeadline(t.l.Name(), t.l.RLock)
	}
	start, left := time.Now(), wait
	for {
		g, err := acquireByWait(ctx, left, try, lock, lockTimeout)
		if err != nil {
			return nil, err
		}
		var w *advisorylock.Holder
		if t.gated {
			w, err = t.window(ctx)
		}
		if w == nil && err == nil {
			return &held{lost: g.Lost(), release: g.Release}, nil
		}
		_ = g.Release(context.Background())
		switch {
		case err != nil:
			return nil, err
		case wait == 0:
			return nil, errWindowOpen
		}
		if left, err = sleepThroughWindow(ctx, t.l.Name(), w, start, wait); err != nil {
			return nil, err
		}
	}
}

// window reports the first open min-hold window on t's names, nil when
// none is open.
func (t sessionTarget) window(ctx context.Context) (*advisorylock.Holder, error) {
	for _, n := range t.names {
		if w, err := openWindow(ctx, t.db, n); w != nil || err != nil {
			return w, err
		}
	}
	return nil, nil
}

type semaphoreTarget struct {
	s  *advisorylock.Semaphore
	db *database
}

// holder reports the first of the semaphore's holders, nil when none.
func (t semaphoreTarget) holder(ctx context.Context) (*holding, error) {
	hs, err := t.s.Holders(ctx)
	if err != nil || len(hs) == 0 {
		return nil, err
	}
	h := hs[0]
	r := t.db.row("slot "+strconv.Itoa(h.Slot), slotKey(h.Name, h.Slot), *h)
	return &r, nil
}

func (t semaphoreTarget) acquire(ctx context.Context, wait time.Duration) (*held, error) {
	g, err := acquireByWait(ctx, wait, t.s.TryAcquire, t.s.Acquire, withDeadline(t.s.Name(), t.s.Acquire))
	if err != nil {
		return nil, err
	}
	return &held{lost: g.Lost(), env: []string{"LOCKRUN_SLOT=" + strconv.Itoa(g.Slot())}, release: g.Release}, nil
}

type leaseTarget struct {
	l  *advisorylock.LeaseLock
	db *database
}

func (t leaseTarget) holder(ctx context.Context) (*holding, error) {
	h, err := t.l.Holder(ctx)
	if h == nil || err != nil {
		return nil, err
	}
	r := t.db.row("lease", advisorylock.Key(t.l.Name()), *h)
	return &r, nil
}

func (t leaseTarget) acquire(ctx context.Context, wait time.Duration) (*held, error) {
	g, err := acquireByWait(ctx, wait, t.l.TryLock, t.l.Lock, t.l.LockTimeout)
	if err != nil {
		return nil, err
	}
	return &held{lost: g.Lease().Lost(), token: g.Lease().Token(), release: g.Release}, nil
}

// acquireByWait calls the acquire that matches wait: try once when wait
// is 0, wait as long as it takes when wait < 0, else wait at most wait.
func acquireByWait[G any](ctx context.Context, wait time.Duration, try, lock func(context.Context) (G, error), timeout func(context.Context, time.Duration) (G, error)) (G, error) {
	switch {
	case wait == 0:
		return try(ctx)
	case wait < 0:
		return lock(ctx)
	default:
		return timeout(ctx, wait)
	}
}

// withDeadline bounds lock, an acquire without a Timeout form (RLock, a
// Semaphore's Acquire), by a deadline d away: running out of d is a
// timeout matching advisorylock.ErrTimeout, as LockTimeout's is, while
// ctx's own end stays ctx's error.
func withDeadline[G any](name string, lock func(context.Context) (G, error)) func(context.Context, time.Duration) (G, error) {
	return func(ctx context.Context, d time.Duration) (G, error) {
		bounded, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		g, err := lock(bounded)
		if err != nil && ctx.Err() == nil && bounded.Err() != nil {
			err = waitedOut(name, d)
		}
		return g, err
	}
}

// waitedOut is the error of a wait for name that d bounded and that ran
// out: it matches advisorylock.ErrTimeout.
func waitedOut(name string, d time.Duration) error {
	return fmt.Errorf("lock %q: %w: not acquired within %s", name, advisorylock.ErrTimeout, d)
}

// run takes the lock, runs the command, and releases the lock once the
// command has exited. It returns lockrun's exit code.
func run(o *options, say *reporter) int {
	cmd := exec.Command(o.command[0], o.command[1:]...)
	if cmd.Err != nil {
		return notRunnable(say, o.command[0], cmd.Err)
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, forwarded...)
	defer signal.Stop(signals)
	if o.once != "" {
		return runOnce(cmd, o, signals, say)
	}

	db, h, err := takeUnlessSignaled(o, signals, say)
	if err != nil {
		return failed(say, o, err)
	}
	defer db.Close()
	say.debugf("acquired lock %q%s", o.name, tokenNote(h.token))
	if isClosed(h.lost) {
		// A grant that came back past its local deadline (a statement
		// that waited most of the TTL) is lost on arrival: the command
		// does not start.
		say.warnf("lock %q lost as it was granted%s; the command did not run", o.name, say.cause.why())
		_ = h.release(context.Background())
		return exitLost
	}
	code := supervise(cmd, o, h, signals, say)
	lost := isClosed(h.lost)
	err = h.release(context.Background())
	switch {
	case lost: // said already, by supervise; releasing it can only fail
	case err != nil:
		say.warnf("releasing lock %q: %s", o.name, plain(err))
	default:
		say.debugf("released lock %q", o.name)
	}
	return code
}

// runOnce runs the command under the lock at most once for the run key
// o.once (Lock.TryDoOnce): the run is recorded done once the command
// exits 0, and every later lockrun --once with the same NAME and run key
// exits with o.doneCode (0 unless --done-exit-code) without running it,
// as does one that finds another holder running it now. A command that
// fails (or loses the lock) leaves the run not done, so the next arrival
// runs it; lockrun exits with its code.
func runOnce(cmd *exec.Cmd, o *options, signals <-chan os.Signal, say *reporter) int {
	ctx := context.Background()
	db, err := connect(ctx, o, say)
	if err != nil {
		return failed(say, o, err)
	}
	defer db.Close()
	say.debugf("%s", db.describe(o.dsnFrom))
	t, err := newTarget(db, o, say)
	if err != nil {
		return failed(say, o, err)
	}
	st, ok := t.(sessionTarget)
	if !ok || st.shared || o.minHold > 0 { // the config file may set lease, slots or min-hold
		return failed(say, o, configErrorf("--once takes an exclusive lock without a window: not with lease, slots or min-hold (from the config file)"))
	}
	code := 0
	ran, err := st.l.TryDoOnce(ctx, o.once, func(ctx context.Context) error {
		say.debugf("acquired lock %q for run %q", o.name, o.once)
		code = supervise(cmd, o, &held{lost: advisorylock.GuardFromContext(ctx).Lost()}, signals, say)
		if code != 0 {
			return errRunFailed
		}
		return nil
	})
	switch {
	case errors.Is(err, errRunFailed):
		say.debugf("run %q of lock %q is not done: the command exited %d", o.once, o.name, code)
		return code
	case err != nil:
		return failed(say, o, err)
	case !ran:
		say.debugf("run %q of lock %q is done, or running elsewhere: the command did not run", o.once, o.name)
		return o.doneCode
	}
	say.debugf("run %q of lock %q done; released the lock", o.once, o.name)
	return 0
}

// errRunFailed is what runOnce's fn returns for a command that did not
// exit 0: the run is not recorded done.
var errRunFailed = errors.New("lockrun: the command failed")

// signaled is the error of a wait for the lock that a signal ended.
type signaled struct{ sig os.Signal }

func (s signaled) Error() string { return "interrupted by " + s.sig.String() }

// takeUnlessSignaled opens the database and takes the lock, unless a
// signal comes first: then it undoes what it did and returns signaled.
func takeUnlessSignaled(o *options, signals <-chan os.Signal, say *reporter) (*database, *held, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		db  *database
		h   *held
		err error
	}
	taken := make(chan outcome, 1)
	go func() {
		db, h, err := take(ctx, o, say)
		taken <- outcome{db, h, err}
	}()
	select {
	case got := <-taken:
		return got.db, got.h, got.err
	case sig := <-signals:
		cancel()
		got := <-taken
		if got.h != nil {
			_ = got.h.release(context.Background())
		}
		if got.db != nil {
			_ = got.db.Close()
		}
		return nil, nil, signaled{sig}
	}
}

// take opens the database and acquires the lock, saying what it waits for
// while it waits (with -v). On error, it has closed what it opened.
func take(ctx context.Context, o *options, say *reporter) (*database, *held, error) {
	db, err := connect(ctx, o, say)
	if err != nil {
		return nil, nil, err
	}
	say.debugf("%s", db.describe(o.dsnFrom))
	t, err := newTarget(db, o, say)
	if err == nil {
		var h *held
		h, err = acquireTelling(ctx, t, o, say)
		if err == nil {
			return db, h, nil
		}
	}
	_ = db.Close()
	return nil, nil, err
}

// connect opens the database o names and learns its secrets.
func connect(ctx context.Context, o *options, say *reporter) (*database, error) {
	say.secrets = dsnSecrets(o.dsn)
	db, err := openDatabase(ctx, o.dsn)
	if err != nil {
		return nil, err
	}
	say.secrets = append(say.secrets, db.secrets...)
	return db, nil
}

// newTarget makes the lock: a Semaphore with --slots, a LeaseLock with
// --lease, a Lock otherwise.
func newTarget(db *database, o *options, say *reporter) (target, error) {
	opts := []advisorylock.Option{advisorylock.WithOwner(ownerLabel()), advisorylock.WithLogger(say.logger())}
	if o.ttl > 0 {
		opts = append(opts, advisorylock.WithLeaseTTL(o.ttl))
	}
	if o.minHold > 0 {
		opts = append(opts, advisorylock.WithMinHold(o.minHold))
	}
	if o.leaseRows && !o.lease { // a LeaseLock is a row already
		opts = append(opts, advisorylock.WithLeaseRows())
	}
	if o.shared && (o.lease || o.minHold > 0) {
		return nil, errors.New("-s takes a lock shared; a lease or a min-hold window (from the config file) is exclusive")
	}
	if o.isSet() {
		return newSetTarget(db, o, say, opts)
	}
	if o.slots > 0 {
		if err := o.checkSlots(); err != nil { // the config file may set slots, lease or min-hold
			return nil, configErrorf("%w (one of them from the config file)", err)
		}
		s, err := advisorylock.NewSemaphore(db, o.name, o.slots, opts...)
		if err != nil {
			return nil, err
		}
		return semaphoreTarget{s: s, db: db}, nil
	}
	if o.lease {
		l, err := advisorylock.NewLeaseLock(db, o.name, opts...)
		if err != nil {
			return nil, err
		}
		return leaseTarget{l: l, db: db}, nil
	}
	l, err := advisorylock.New(db, o.name, opts...)
	if err != nil {
		return nil, err
	}
	return sessionTarget{l: l, db: db, names: []string{o.name}, shared: o.shared, gated: o.minHold == 0 && db.kind != "sqlite" && !o.leaseRows}, nil
}

// newSetTarget makes the set of the -l locks (NewSet): from here on
// lockrun names it by the set's name, its names in key order joined by
// ",", the order in which a wait takes them.
func newSetTarget(db *database, o *options, say *reporter, opts []advisorylock.Option) (target, error) {
	if err := o.setExcludes(); err != nil { // the config file may set lease, slots or min-hold
		return nil, configErrorf("%w (from the config file)", err)
	}
	l, err := advisorylock.NewSet(db, o.locks, opts...)
	if err != nil {
		return nil, err
	}
	o.name, say.lock = l.Name(), l.Name()
	return sessionTarget{l: l, db: db, names: strings.Split(l.Name(), ","), gated: db.kind != "sqlite" && !o.leaseRows}, nil
}

// ownerLabel is host:pid, the label lease rows record.
func ownerLabel() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// acquireTelling acquires t. With -v it says who holds the lock when -n
// finds it held, and while it waits, what it waits for and who holds it,
// again whenever the holder changes.
func acquireTelling(ctx context.Context, t target, o *options, say *reporter) (*held, error) {
	h, err := t.acquire(ctx, 0)
	if o.wait == 0 || !errors.Is(err, advisorylock.ErrNotAcquired) {
		if errors.Is(err, advisorylock.ErrNotAcquired) && say.verbose {
			say.debugf("lock %q is held%s", o.name, holderNote(ctx, t, o))
		}
		return h, err
	}
	// The first attempt failed, so there is a wait to report (a report
	// racing the grant would name this process as the holder).
	wctx, stop := context.WithCancel(ctx)
	told := make(chan struct{})
	go func() {
		defer close(told)
		tellWaiting(wctx, t, o, say)
	}()
	h, err = t.acquire(ctx, o.wait)
	stop()
	<-told
	return h, err
}

// tellWaiting reports, with -v, the holder at once and whenever it
// changes, until ctx ends.
func tellWaiting(ctx context.Context, t target, o *options, say *reporter) {
	if !say.verbose || say.quiet {
		return
	}
	last := "-"
	for {
		h, err := t.holder(ctx)
		if ctx.Err() != nil {
			return
		}
		note := ""
		switch {
		case err != nil:
			note = " (cannot tell who holds it: " + plain(err) + ")"
		case h != nil:
			note = ", held by " + heldBy(h, o)
		}
		if note != last {
			say.debugf("waiting for lock %q%s", o.name, note)
			last = note
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(recheck):
		}
	}
}

// holderNote is " by HOLDER" for what holds the lock (see heldBy), or "".
func holderNote(ctx context.Context, t target, o *options) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, err := t.holder(ctx)
	if err != nil || h == nil {
		return ""
	}
	return " by " + heldBy(h, o)
}

// heldBy says what holds the lock: its holder, or a min-hold window, with
// its end and its last holder, and to a run without --min-hold that it
// must give the one its holders give; for a set, which of its names is
// held.
func heldBy(h *holding, o *options) string {
	on := ""
	if o.isSet() {
		on = " (name " + strconv.Quote(h.h.Name) + ")"
	}
	if h.kind != "window" {
		return describe(h) + on
	}
	s := "a min-hold window until " + h.h.ExpiresAt.Local().Format(time.DateTime) + " (last holder: " + describe(h) + ")" + on
	if o.minHold == 0 {
		s += "; run with the same --min-hold as its holders"
	}
	return s
}

// describe says who a holder is, in the words an operator greps for.
func describe(r *holding) string {
	h := &r.h
	var parts []string
	if pid := holderPID(r); pid != 0 {
		parts = append(parts, "pid "+strconv.Itoa(pid))
	}
	if h.Client != "" {
		parts = append(parts, "client "+shown(h.Client))
	}
	if h.Owner != "" {
		parts = append(parts, "owner "+h.Owner)
	}
	if h.Token != 0 {
		parts = append(parts, "token "+strconv.FormatUint(uint64(h.Token), 10))
	}
	if !h.Since.IsZero() {
		parts = append(parts, "since "+h.Since.Local().Format(time.DateTime))
	}
	if len(parts) == 0 {
		return "an unknown holder"
	}
	return strings.Join(parts, ", ")
}

// holderPID is the PostgreSQL backend's pid of a session holder, or the
// process id of a SQLite holder on this host (see ownerPID). It is 0 if
// unknown.
func holderPID(r *holding) int {
	if r.h.PID != 0 || !r.sqlite {
		return r.h.PID
	}
	return ownerPID(&r.h)
}

// ownerPID is the process id of a holder on this host, read from the
// owner label that lockrun (and the library by default) gives it,
// HOST:PID, to which the library adds /SUFFIX; 0 if it has none.
func ownerPID(h *advisorylock.Holder) int {
	host, rest, _ := strings.Cut(h.Owner, ":")
	if this, err := os.Hostname(); err != nil || host != this {
		return 0
	}
	digits, _, _ := strings.Cut(rest, "/")
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func tokenNote(t advisorylock.FencingToken) string {
	if t == 0 {
		return ""
	}
	return " (fencing token " + strconv.FormatUint(uint64(t), 10) + ")"
}

// supervise starts the command and waits for it, passing signals on to
// its process group, and stopping it if the lock is lost. It returns the
// command's exit status, or exitLost.
func supervise(cmd *exec.Cmd, o *options, h *held, signals <-chan os.Signal, say *reporter) int {
	exited, err := startCommand(cmd, o.name, h.token, h.env...)
	if err != nil {
		return notRunnable(say, o.command[0], err)
	}
	lost := h.lost
	wasLost := false
	var kill <-chan time.Time
	for {
		select {
		case sig := <-signals:
			signalGroup(cmd.Process, sig)
		case <-lost:
			lost, wasLost = nil, true
			say.warnf("lock %q lost while the command ran%s; stopping it (SIGTERM, then SIGKILL after %s)", o.name, say.cause.why(), o.killAfter)
			signalGroup(cmd.Process, terminate)
			timer := time.NewTimer(o.killAfter)
			defer timer.Stop()
			kill = timer.C
		case <-kill:
			kill = nil
			signalGroup(cmd.Process, killSignal)
		case <-exited:
			if !wasLost && isClosed(h.lost) {
				wasLost = true
				say.warnf("lock %q lost before the command ended%s", o.name, say.cause.why())
			}
			if wasLost {
				signalGroup(cmd.Process, killSignal) // what is left of the job
				return exitLost
			}
			return exitStatus(cmd.ProcessState)
		}
	}
}

// startCommand starts cmd in its own process group, with lockrun's stdin,
// stdout and stderr and the lock's variables; the returned channel is
// closed once it has exited (its status is then in cmd.ProcessState).
func startCommand(cmd *exec.Cmd, name string, token advisorylock.FencingToken, extra ...string) (<-chan struct{}, error) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = childEnv(os.Environ(), name, token, extra...)
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return exited, nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// childEnv is env with the lock's name, for a lease its token, and extra
// (a semaphore's LOCKRUN_SLOT).
func childEnv(env []string, name string, token advisorylock.FencingToken, extra ...string) []string {
	out := make([]string, 0, len(env)+2+len(extra))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "LOCKRUN_LOCK_NAME=") && !strings.HasPrefix(kv, "LOCKRUN_FENCING_TOKEN=") && !strings.HasPrefix(kv, "LOCKRUN_SLOT=") {
			out = append(out, kv)
		}
	}
	out = append(out, extra...)
	out = append(out, "LOCKRUN_LOCK_NAME="+name)
	if token != 0 {
		out = append(out, "LOCKRUN_FENCING_TOKEN="+strconv.FormatUint(uint64(token), 10))
	}
	return out
}

// notRunnable reports a command that cannot be started: 127 when it is
// not found, 126 otherwise (as a shell does).
func notRunnable(say *reporter, name string, err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		say.errorf("%s: command not found", name)
		return exitNotFound
	}
	if inner := errors.Unwrap(err); inner != nil {
		err = inner // the reason, without the repeated path
	}
	say.errorf("%s: cannot run: %v", name, err)
	return exitNotRunnable
}

// failed reports why the lock was not taken and returns the exit code. A
// conflict is silent unless -v, as in flock.
func failed(say *reporter, o *options, err error) int {
	var sig signaled
	switch {
	case errors.As(err, &sig):
		say.debugf("interrupted by %v while waiting for lock %q", sig.sig, o.name)
		return exitSignalOffset + signalNumber(sig.sig)
	case errors.Is(err, advisorylock.ErrNotAcquired):
		return o.conflictCode // -v said who holds it, in acquireTelling
	case errors.Is(err, advisorylock.ErrTimeout):
		say.debugf("gave up waiting for lock %q after %s", o.name, o.wait)
		return o.conflictCode
	case errors.Is(err, advisorylock.ErrTransactionPooler):
		if o.isSet() {
			say.errorf("lock %q: the database is reached through a transaction-mode pooler (such as PgBouncer with pool_mode=transaction), where a session lock cannot hold; run lockrun with --lease-rows, which keeps the set as lease rows and works there", o.name)
			return exitConfig
		}
		say.errorf("lock %q: the database is reached through a transaction-mode pooler (such as PgBouncer with pool_mode=transaction), where a session lock cannot hold; run lockrun with --lease-rows (or --lease, for a fencing token), which works there", o.name)
		return exitConfig
	}
	say.errorf("%s", plain(err))
	return codeFor(err)
}

// codeFor maps an error about the database to an exit code: 78 for what
// the configuration must fix (on PostgreSQL and MySQL that includes bad
// credentials and an unknown database), 70 for an error lockrun or the library
// should not have caused, 69 for the rest (the database is unreachable,
// shutting down, out of connections, or a SQLite file cannot be used).
func codeFor(err error) int {
	var pgErr *pgconn.PgError
	var liteErr *sqlite.Error
	var confErr configError
	switch {
	case errors.As(err, &confErr), errors.Is(err, advisorylock.ErrUnsupported), errors.Is(err, advisorylock.ErrTransactionPooler),
		mysqlRefusesLogin(err):
		return exitConfig
	case errors.As(err, &pgErr):
		switch pgErr.Code[:2] {
		case "08", "53", "57", "58":
			return exitUnavailable
		case "28", "3D":
			return exitConfig // bad credentials, no such database
		}
		return exitSoftware
	case errors.As(err, &liteErr):
		switch liteErr.Code() & 0xff {
		case 1, 19, 20, 21, 25: // SQL error, constraint, mismatch, misuse, range
			return exitSoftware
		case 26: // not a database
			return exitConfig
		}
	}
	return exitUnavailable
}

// plain is err's message without the library's "advisorylock: " prefix
// (lockrun adds its own).
func plain(err error) string {
	return strings.TrimPrefix(err.Error(), "advisorylock: ")
}
