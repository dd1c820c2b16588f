package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// muxHolder is one of the many multiplexed holders of
// TestMultiplexedSessionKilledUnderContention: its first section holds
// its name until the test lets go (or the lock is lost).
type muxHolder struct {
	name  string
	key   int64
	first atomic.Pointer[section] // the first section, once fn entered it
	done  atomic.Bool             // the first Do returned
}

// TestMultiplexedSessionKilledUnderContention holds 200 names on the
// default shared sessions (a Do each, from one pool of 8 connections), while
// rival workers (multiplexed ones on the same pool and on another, pinned
// ones on another) contend for 40 of those names, 20 of them on the
// session to be killed, with TryDo and Do. That shared session (the one of
// the 2 to 4 holding the most) is then ended on the server
// (pg_terminate_backend, KILL): every holder on it must be told it lost its lock (fn's context
// cancelled), no holder on another session may be told, the server must
// still show those names on their sessions, rivals must then get some of
// the freed names, and nothing may hang. Every Do of holders and rivals is
// recorded under its name, and each name's history (a lock per name) must
// be linearizable, with no section entered beside an untold holder.
func TestMultiplexedSessionKilledUnderContention(t *testing.T) {
	testdb.Slow(t, "fault: sessions killed under contention")
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			testdb.CheckGoroutines(t)
			db, rivalDB, admin := srv.open(t), srv.open(t), srv.open(t)
			db.SetMaxOpenConns(8)
			rivalDB.SetMaxOpenConns(6)
			names, keys := muxNames(t, 200)
			figs, rivalFigs := &figures{}, &figures{}
			secs := map[string]*sections{}
			var all []*sections
			for _, n := range names {
				secs[n] = newSections(n, figs, t.Logf).sessionFaults(5 * time.Second)
				all = append(all, secs[n])
			}
			ctx, stop := context.WithCancel(context.Background())
			letGo := make(chan struct{})
			release := sync.OnceFunc(func() { close(letGo) })
			var wg sync.WaitGroup
			t.Cleanup(func() { release(); stop(); wg.Wait() })
			var inside atomic.Int32

			holders := make([]*muxHolder, len(names))
			for i, n := range names {
				h := &muxHolder{name: n, key: keys[i]}
				holders[i] = h
				l := newLock(t, db, n, muxFaultOptions...)
				wg.Go(func() { h.run(ctx, l, secs[n], figs, letGo, &inside) })
			}
			if !eventually(func() bool { return inside.Load() == int32(len(names)) }) {
				t.Fatalf("%d of %d holders got their names", inside.Load(), len(names))
			}
			held := srv.sessions(t, admin, keys)
			if len(held) != len(keys) {
				t.Fatalf("the server shows %d of %d names held", len(held), len(keys))
			}
			bySession := distinct(held)
			if len(bySession) < 2 || len(bySession) > 4 {
				t.Fatalf("the names are held by %d server sessions, want 2 to 4: %v", len(bySession), bySession)
			}
			var victim int64
			for s, n := range bySession {
				if victim == 0 || n > bySession[victim] {
					victim = s
				}
			}

			// The rivals contend for 40 names, half on the victim, half off it.
			var contended []string
			onVictim, offVictim := 0, 0
			for i, n := range names {
				switch {
				case held[keys[i]] == victim && onVictim < 20:
					onVictim++
				case held[keys[i]] != victim && offVictim < 20:
					offVictim++
				default:
					continue
				}
				contended = append(contended, n)
			}
			t.Logf("sessions and their names: %v; the victim, %d, holds %d", bySession, victim, bySession[victim])
			pinnedOpts := []advisorylock.Option{quiet, pinned, advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}
			for i, rival := range []struct {
				db   *sql.DB
				opts []advisorylock.Option
			}{{db, muxFaultOptions}, {db, muxFaultOptions}, {rivalDB, muxFaultOptions}, {rivalDB, muxFaultOptions}, {rivalDB, pinnedOpts}, {rivalDB, pinnedOpts}} {
				wg.Go(func() { rivalWorker(ctx, t, rival.db, rival.opts, contended, secs, rivalFigs, i%2 == 0) })
			}
			if !eventually(func() bool { return rivalFigs.ops.Load() >= 20 }) {
				t.Fatalf("the rivals made %d attempts", rivalFigs.ops.Load())
			}
			if n := rivalFigs.acquired.Load(); n != 0 {
				t.Fatalf("rivals got %d sections while every name was held", n)
			}

			for _, s := range all {
				s.fault()
			}
			killed := time.Now()
			srv.kill(t, admin, victim)
			deadline := time.After(wait)
			lost := 0
			for _, h := range holders {
				if held[h.key] != victim {
					continue
				}
				for h.first.Load().told.Load() == 0 {
					select {
					case <-deadline:
						t.Fatalf("lock %s, on the killed session %d, was not reported lost within %v", h.name, victim, wait)
					case <-time.After(5 * time.Millisecond):
					}
				}
				lost++
			}
			t.Logf("%d locks on the killed session reported lost within %v", lost, time.Since(killed).Round(time.Millisecond))
			if !eventually(func() bool { return rivalFigs.acquired.Load() > 0 }) {
				t.Fatalf("no rival got a freed name: %v", rivalFigs)
			}
			// Nothing must happen to the others: give their keep-alives
			// (every 200ms) several checks to get it wrong.
			time.Sleep(time.Second)
			now := srv.sessions(t, admin, keys)
			for _, h := range holders {
				if held[h.key] == victim {
					continue
				}
				if h.first.Load().told.Load() != 0 || h.done.Load() {
					t.Errorf("lock %s, on session %d, reported lost (or ended) when session %d was killed", h.name, held[h.key], victim)
				} else if now[h.key] != held[h.key] {
					t.Errorf("lock %s: the server shows session %d, was %d", h.name, now[h.key], held[h.key])
				}
			}

			release()
			if !eventually(func() bool { return figs.ops.Load() >= int64(len(names)) }) {
				t.Errorf("%d of %d holders' first Do returned", figs.ops.Load(), len(names))
			}
			stop()
			waitGroupWithin(t, &wg, wait, "holders and rivals")
			for _, s := range all {
				s.settle()
			}
			checkHistory(t, all...) // history hook
			t.Logf("holders: %v", figs)
			t.Logf("rivals: %v", rivalFigs)
			if v := figs.violations.Load(); v != 0 {
				t.Errorf("%d violations of mutual exclusion (see the log)", v)
			}
			if figs.losses.Load() < int64(lost) {
				t.Errorf("%d Do calls reported a loss, want at least %d", figs.losses.Load(), lost)
			}
			if !eventually(func() bool { return len(srv.sessions(t, admin, keys)) == 0 }) {
				t.Errorf("%d names still held on the server", len(srv.sessions(t, admin, keys)))
			}
			for _, p := range []*sql.DB{db, rivalDB} {
				if !eventually(func() bool { return p.Stats().InUse == 0 }) {
					t.Errorf("%d connections left checked out", p.Stats().InUse)
				}
			}
		})
	}
}

// run holds h's name with Do until ctx ends: the first section until
// letGo closes or the lock is lost, later ones briefly.
func (h *muxHolder) run(ctx context.Context, l *advisorylock.Lock, secs *sections, figs *figures, letGo <-chan struct{}, inside *atomic.Int32) {
	for first := true; ctx.Err() == nil; first = false {
		start := time.Now()
		var sec *section
		err := l.Do(ctx, func(fctx context.Context) error {
			figs.acquiredAfter(time.Since(start))
			sec = secs.enter(fctx, nil)
			defer secs.exit(sec)
			var hold <-chan time.Time
			if first {
				h.first.Store(sec)
				inside.Add(1)
			} else {
				hold = time.After(rand.N(10 * time.Millisecond))
			}
			select {
			case <-hold:
				return nil
			case <-firstHold(first, letGo):
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		})
		if sec != nil && err != nil {
			sec.tell() // see sessionWorker
		}
		secs.record(start, sec) // history hook
		figs.outcome(ctx, err, false)
		if first {
			h.done.Store(true)
		}
	}
}

// firstHold is what ends a holder's first section (letGo); nil, which
// never does, for later ones.
func firstHold(first bool, letGo <-chan struct{}) <-chan struct{} {
	if first {
		return letGo
	}
	return nil
}

// rivalWorker takes random names of contended until ctx ends, with
// TryDo (try) or with a Do bounded to 300ms, holding each for a few
// milliseconds.
func rivalWorker(ctx context.Context, t *testing.T, db *sql.DB, opts []advisorylock.Option, contended []string, secs map[string]*sections, figs *figures, try bool) {
	for ctx.Err() == nil {
		name := contended[rand.IntN(len(contended))]
		l, err := advisorylock.New(db, name, opts...)
		if err != nil {
			t.Errorf("New(%q): %v", name, err)
			return
		}
		start := time.Now()
		var sec *section
		fn := func(fctx context.Context) error {
			figs.acquiredAfter(time.Since(start))
			sec = secs[name].enter(fctx, nil)
			defer secs[name].exit(sec)
			select {
			case <-time.After(rand.N(5 * time.Millisecond)):
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		}
		if try {
			var ran bool
			if ran, err = l.TryDo(ctx, fn); !ran && err == nil {
				secs[name].record(start, nil) // history hook
				figs.ops.Add(1)
				time.Sleep(rand.N(5 * time.Millisecond)) // a try that missed does not spin on the server
				continue
			}
		} else {
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err = l.Do(wctx, fn)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) && sec == nil {
				err = nil // waited its while without the lock
			}
		}
		if sec != nil && err != nil {
			sec.tell()
		}
		secs[name].record(start, sec) // history hook
		figs.outcome(ctx, err, false)
	}
}

// keyDropper is a backend (PostgreSQL's or MySQL's), used through its
// exported interfaces, with faults of its own for the keep-alive
// (HeldKeys) of a shared session, which stays up: the next check of a
// session that holds the key in drop first lets go of that key on the
// server (pg_advisory_unlock, RELEASE_LOCK on the session), as other code
// sharing the session might, and then runs then (if set) with the key;
// with fail set, the next check runs a statement the server refuses and
// returns its error.
type keyDropper struct {
	backend.SessionLocker
	unlock  string // the statement that lets go of a key on the session; its one argument is arg's
	arg     func(int64) any
	drop    *atomic.Int64 // the key to let go of; 0: none
	then    *atomic.Pointer[func(key int64)]
	fail    *atomic.Bool
	dropped chan int64 // each key let go of
}

var _ interface {
	backend.Validator
	backend.Configurer
	backend.MultiplexLocker
} = keyDropper{}

// newKeyDropper wraps the backend of srv, a muxServer's name.
func newKeyDropper(srv string) keyDropper {
	d := keyDropper{SessionLocker: advisorylock.Postgres().(backend.SessionLocker), unlock: "SELECT pg_advisory_unlock($1)", arg: func(k int64) any { return k },
		drop: new(atomic.Int64), then: new(atomic.Pointer[func(int64)]), fail: new(atomic.Bool), dropped: make(chan int64, 1)}
	if srv == "mysql" {
		d.SessionLocker = advisorylock.MySQL().(backend.SessionLocker)
		d.unlock, d.arg = "SELECT RELEASE_LOCK(?) = 1", func(k int64) any { return fmt.Sprintf("advisorylock:v1:%016x", uint64(k)) }
	}
	return d
}

// Configure keeps the fault on the backend configured for the handle and
// for a Lock.
func (d keyDropper) Configure(db backend.DB, deadHolder time.Duration, serverChecks bool) backend.Backend {
	d.SessionLocker = d.SessionLocker.(backend.Configurer).Configure(db, deadHolder, serverChecks).(backend.SessionLocker)
	return d
}

// Validate validates as the wrapped backend does.
func (d keyDropper) Validate(ctx context.Context, db backend.DB) error {
	return d.SessionLocker.(backend.Validator).Validate(ctx, db)
}

func (d keyDropper) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	if d.fail.CompareAndSwap(true, false) {
		_, err := conn.ExecContext(ctx, "SELECT * FROM advisorylock_no_such_table")
		if err == nil {
			err = errors.New("a statement on a missing table succeeded")
		}
		return nil, fmt.Errorf("the keep-alive's statement was refused: %w", err)
	}
	if k := d.drop.Load(); k != 0 && slices.Contains(keys, k) && d.drop.CompareAndSwap(k, 0) {
		var ok bool
		if err := conn.QueryRowContext(ctx, d.unlock, d.arg(k)).Scan(&ok); err != nil || !ok {
			return nil, fmt.Errorf("letting go of key %d: %v, %w", k, ok, err)
		}
		if then := d.then.Swap(nil); then != nil {
			(*then)(k)
		}
		d.dropped <- k
	}
	return d.SessionLocker.(backend.MultiplexLocker).HeldKeys(ctx, conn, keys)
}

// TestMultiplexedKeepAliveLosesOnlyTheMissingKeys: when a live shared
// session no longer holds one of its keys, its keep-alive reports that
// lock lost and no other on the session, whether the name is free now
// (then a rival, and this process on its shared sessions, can take it
// again) or another session took it (whose lock the keep-alive must not
// count as the session's own). When the key is one of a set's, the set is
// lost and its other names are let go on the server, and again its
// neighbours keep theirs. PostgreSQL (pgx) and MariaDB.
func TestMultiplexedKeepAliveLosesOnlyTheMissingKeys(t *testing.T) {
	testdb.Slow(t, "fault: locks dropped under a shared session")
	t.Parallel()
	// The servers' subtests run side by side: each has its own names,
	// pools and key dropper. The goroutine check covers them together, on
	// the whole test.
	testdb.CheckGoroutines(t)
	for _, srv := range muxServers()[1:] {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			db, rivalDB, admin := srv.open(t), srv.open(t), srv.open(t)
			db.SetMaxOpenConns(8)
			d := newKeyDropper(srv.name)
			opts := append(slices.Clip(muxFaultOptions), advisorylock.WithBackend(d))
			names, keys := muxNames(t, 60)
			guards := holdAll(t, db, names, 8, opts...)
			setNames, setKeys := muxNames(t, 3)
			set, err := newSet(t, db, setNames, opts...).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held := srv.sessions(t, admin, slices.Concat(keys, setKeys))
			if len(held) != len(keys)+len(setKeys) {
				t.Fatalf("the server shows %d of %d names held", len(held), len(keys)+len(setKeys))
			}
			rivalTry := func(name string) bool {
				g, err := newLock(t, rivalDB, name, quiet).TryLock(context.Background())
				if err == nil {
					mustRelease(t, g)
					return true
				}
				if !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Fatalf("rival TryLock(%s): %v", name, err)
				}
				return false
			}
			lost := map[int]bool{}
			notLost := func() {
				t.Helper()
				for i, g := range guards {
					select {
					case <-g.Lost():
						if !lost[i] {
							t.Fatalf("lock %s (session %d) reported lost, though its session still holds it", names[i], held[keys[i]])
						}
					default:
						if lost[i] {
							t.Fatalf("lock %s, let go of on its session, was not reported lost", names[i])
						}
					}
				}
			}
			dropped := func(k int64, then func(int64)) {
				t.Helper()
				if then != nil {
					d.then.Store(&then)
				}
				d.drop.Store(k)
				select {
				case <-d.dropped:
				case <-time.After(wait):
					t.Fatalf("no keep-alive let go of key %d", k)
				}
			}
			lose := func(i int, then func(int64)) {
				t.Helper()
				dropped(keys[i], then)
				select {
				case <-guards[i].Lost():
				case <-time.After(wait):
					t.Fatalf("lock %s, let go of on its session (taken by another: %v), was not reported lost", names[i], then != nil)
				}
				lost[i] = true
			}

			lose(0, nil)
			// Give the keep-alives (every 200ms) several checks to get the others wrong.
			time.Sleep(time.Second)
			notLost()
			if !rivalTry(names[0]) {
				t.Fatalf("a rival could not take %s, which its session let go of", names[0])
			}
			again, err := newLock(t, db, names[0], opts...).TryLock(context.Background())
			if err != nil {
				t.Fatalf("this process could not take %s again on its shared sessions, after their keep-alive lost it: %v", names[0], err)
			}
			mustRelease(t, again)
			for _, n := range names[2:10] {
				if rivalTry(n) {
					t.Fatalf("a rival took %s, held on a shared session", n)
				}
			}

			var other *advisorylock.Guard
			lose(1, func(int64) { // on the keep-alive's goroutine, before its check
				g, err := newLock(t, rivalDB, names[1], quiet).TryLock(context.Background())
				if err != nil {
					t.Errorf("another session's TryLock of %s, let go of by its shared session: %v", names[1], err)
				}
				other = g
			})
			time.Sleep(time.Second)
			notLost()
			if other == nil {
				t.FailNow()
			}
			select {
			case <-other.Lost():
				t.Fatalf("the other session's lock of %s was lost", names[1])
			default:
			}
			mustRelease(t, other)

			dropped(setKeys[1], nil)
			select {
			case <-set.Lost():
			case <-time.After(wait):
				t.Fatal("the set, one of whose names its session let go of, was not reported lost")
			}
			if !eventually(func() bool { return len(srv.sessions(t, admin, setKeys)) == 0 }) {
				t.Fatalf("the lost set's other names are still held: %v", srv.sessions(t, admin, setKeys))
			}
			time.Sleep(time.Second)
			notLost()
			for _, n := range setNames {
				if !rivalTry(n) {
					t.Fatalf("a rival could not take %s, of the lost set", n)
				}
			}
			mustRelease(t, set)
			releaseAll(t, guards)
			if left := srv.sessions(t, admin, slices.Concat(keys, setKeys)); len(left) != 0 {
				t.Fatalf("%d names still held on the server after the release", len(left))
			}
		})
	}
}

// slowToTell is an Observer whose first loss event waits, up to a second,
// for a rival's grant (granted closing): a library that frees a lock's
// names on the server before it has told every holder of the loss hands
// the rival its grant during that wait.
type slowToTell struct {
	granted <-chan struct{}
	once    sync.Once
	early   atomic.Bool // the rival was granted while a loss was being told
}

func (o *slowToTell) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	if e.Type == "loss" {
		o.once.Do(func() {
			select {
			case <-o.granted:
				o.early.Store(true)
			case <-time.After(time.Second):
			}
		})
	}
	return ctx
}

// TestSharedSessionTellsItsHoldsBeforeARivalGetsTheirNames: every hold on
// a shared session is told it is lost (Lost closed, the Observer told)
// before the server can grant its names to a rival waiting for them, so
// that no two holders ever both believe they hold a name. Two cases, on a
// live session (WithMultiplexing(1)): a set loses one of its names, and
// its other names, which the keep-alive then lets go of, are what the
// rival waits for; and the keep-alive's statement is refused by the
// server, which ends the session, and the rival waits for one of two
// locks on it, which its discarded connection frees. The Observer is slow
// to hear of the first loss (a second), which the library must wait out
// before it frees the names. After the session ended, this process can
// take the names again on its shared sessions. PostgreSQL (pgx), MariaDB.
func TestSharedSessionTellsItsHoldsBeforeARivalGetsTheirNames(t *testing.T) {
	testdb.Slow(t, "fault: an Observer held a second while a rival waits on the server")
	t.Parallel()
	for _, srv := range muxServers()[1:] {
		t.Run(srv.name, func(t *testing.T) {
			testdb.CheckGoroutines(t)
			db, rivalDB := srv.open(t), srv.open(t)
			d := newKeyDropper(srv.name)
			opts := []advisorylock.Option{quiet, advisorylock.WithBackend(d), advisorylock.WithMultiplexing(1),
				advisorylock.WithKeepAlive(100 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			// toldBeforeTheRival holds guards, then makes the fault and
			// has a rival wait for name: when the rival is granted, every
			// guard must have been told, and the Observer not be telling.
			toldBeforeTheRival := func(what string, take func(opts []advisorylock.Option) []*advisorylock.Guard, name string, fault func()) {
				t.Helper()
				granted := make(chan struct{})
				obs := &slowToTell{granted: granted}
				guards := take(append(slices.Clip(opts), advisorylock.WithObserver(obs)))
				got := make(chan *advisorylock.Guard, 1)
				var untold []int // indexes in guards
				go func() {
					g, err := newLock(t, rivalDB, name, quiet).Lock(ctx)
					if err != nil {
						t.Errorf("the rival's Lock of %s: %v", name, err)
					}
					for i, h := range guards {
						select {
						case <-h.Lost():
						default:
							untold = append(untold, i)
						}
					}
					close(granted)
					got <- g
				}()
				fault()
				g := <-got
				if g == nil {
					t.FailNow()
				}
				mustRelease(t, g)
				if len(untold) > 0 || obs.early.Load() {
					t.Fatalf("%s: the rival was granted %s while the holders %v (of the guards taken) were untold (the Observer still telling: %v)", what, name, untold, obs.early.Load())
				}
				releaseAll(t, guards)
			}

			setNames, setKeys := byKey(func() []string { n, _ := muxNames(t, 3); return n }())
			toldBeforeTheRival("a set that lost a name", func(opts []advisorylock.Option) []*advisorylock.Guard {
				g, err := newSet(t, db, setNames, opts...).TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return []*advisorylock.Guard{g}
			}, setNames[2], func() { d.drop.Store(setKeys[1]) })

			names, _ := muxNames(t, 2)
			toldBeforeTheRival("a session ended", func(opts []advisorylock.Option) []*advisorylock.Guard {
				var gs []*advisorylock.Guard
				for _, n := range names {
					g, err := newLock(t, db, n, opts...).TryLock(ctx)
					if err != nil {
						t.Fatal(err)
					}
					gs = append(gs, g)
				}
				return gs
			}, names[1], func() { d.fail.Store(true) })
			for _, n := range names {
				g, err := newLock(t, db, n, opts...).TryLock(ctx)
				if err != nil {
					t.Fatalf("this process could not take %s again after its shared session ended: %v", n, err)
				}
				mustRelease(t, g)
			}
		})
	}
}
