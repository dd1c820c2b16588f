package advisorylock_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// The soak's multiplexed and set rows (see TestSoak), on PostgreSQL (a
// lib/pq pool and a pgx pool) and on MariaDB (two pools), each pool
// reaching its server through a cuttable proxy of its own.
//
// The multiplexed row: on each pool, six Locks on the default shared sessions
// over three names, two Locks of each name per pool, so that a pool's
// shared sessions hold several names at once and a name is contended in
// the process (which the pool excludes itself) as well as across pools
// (which the server excludes); half wait with Do, half try with TryDo.
// The set row: on each pool, four sets over four overlapping names, given
// in opposite orders, waiting with Do; half of them multiplexed, half
// pinned (WithMultiplexing(0)).
//
// Each round of faults (injectRound) on each server: the session of a
// multiplexed Lock inside a long section killed on the server
// (pg_terminate_backend, KILL), the session of a set inside one killed,
// one pool's connections reset, one pool cut off for 1.2-2s (its server
// sessions live on meanwhile), and one pool's answers held back by 1.2s,
// longer than a statement's bound.
//
// A violation is two sections inside one name at once where the older
// holder had not been told of its loss (sections, with the excuse of a
// session-ending fault), or a set's Do ending in a deadlock. Every Do and
// TryDo is recorded for the history check, under each name it took: a
// set's call is a call on each of its names, each name a lock of its own.

// muxNoticeWithin is the rows' excuse window (see sections): the soak
// runs beside the whole suite, where a 200ms keep-alive runs late.
const muxNoticeWithin = 5 * time.Second

// muxSoakOptions are the options of the rows' Locks and sets, which
// multiplex by default; the pinned sets add WithMultiplexing(0).
var muxSoakOptions = []advisorylock.Option{quiet, advisorylock.WithKeepAlive(200 * time.Millisecond),
	advisorylock.WithReleaseTimeout(time.Second), advisorylock.WithPollInterval(20 * time.Millisecond)}

// muxLoad is the multiplexed and set rows on one server.
type muxLoad struct {
	backend  string
	admin    *sql.DB // direct to the server: sees no fault
	kill     func(ctx context.Context, admin *sql.DB, id int) error
	probes   map[string]*advisorylock.Lock // a Lock of each name on admin, for Holder
	proxies  []*testdb.Proxy
	pools    []*sql.DB
	muxNames []string
	setNames []string
	mux, set *figures
	// longMux and longSet are the names of a worker of the row inside a
	// long section (see holdBriefly), the target of the row's kills.
	longMux, longSet atomic.Pointer[[]string]
	secs             map[string]*sections
	stop             context.CancelFunc
	wg               sync.WaitGroup

	muxKills, setKills, resets, cuts, delays int // faults injected; only injectRound writes them
}

// startMuxLoads starts the rows on PostgreSQL and on MariaDB.
func startMuxLoads(t *testing.T) []*muxLoad {
	t.Helper()
	pgDSN, myDSN := testdb.PostgresDSN(t), testdb.MySQLDSN(t)
	pg := startMuxLoad(t, "PostgreSQL", testdb.OpenPostgresDSN(t, "pgx", pgDSN), func(i int) (*sql.DB, *testdb.Proxy) {
		p := testdb.NewProxy(t, testdb.HostPort(t, pgDSN))
		return testdb.OpenPostgresDSN(t, testdb.Drivers[i%len(testdb.Drivers)], p.DSN(pgDSN)), p
	}, func(ctx context.Context, admin *sql.DB, id int) error {
		_, err := admin.ExecContext(ctx, "SELECT pg_terminate_backend($1)", id)
		return err
	})
	my := startMuxLoad(t, "MySQL", testdb.OpenMySQLDSN(t, myDSN), func(int) (*sql.DB, *testdb.Proxy) {
		p := testdb.NewMySQLProxy(t, testdb.MySQLAddr(t, myDSN))
		return testdb.OpenMySQLDSN(t, testdb.WithMySQLAddr(t, myDSN, p.Addr())), p
	}, func(ctx context.Context, admin *sql.DB, id int) error {
		_, err := admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id))
		if isUnknownThread(err) {
			return nil // it ended meanwhile
		}
		return err
	})
	return []*muxLoad{pg, my}
}

// startMuxLoad starts both rows' workers on two pools made by open;
// admin reaches the same server directly, and kill ends a session there.
func startMuxLoad(t *testing.T, backend string, admin *sql.DB, open func(i int) (*sql.DB, *testdb.Proxy), kill func(context.Context, *sql.DB, int) error) *muxLoad {
	t.Helper()
	l := &muxLoad{backend: backend, admin: admin, kill: kill, probes: map[string]*advisorylock.Lock{},
		mux: &figures{}, set: &figures{}, secs: map[string]*sections{}}
	l.muxNames, _ = muxNames(t, 3)
	l.setNames, _ = muxNames(t, 4)
	for _, n := range slices.Concat(l.muxNames, l.setNames) {
		l.probes[n] = newLock(t, admin, n, quiet)
	}
	for _, n := range l.muxNames {
		l.secs[n] = newSections(n, l.mux, t.Logf).sessionFaults(muxNoticeWithin)
	}
	for _, n := range l.setNames {
		l.secs[n] = newSections(n, l.set, t.Logf).sessionFaults(muxNoticeWithin)
	}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { l.heal(); stop(); l.wg.Wait() })
	pinnedSets := append(slices.Clip(muxSoakOptions), pinned)
	s := l.setNames
	sets := [][]string{{s[0], s[1], s[2], s[3]}, {s[3], s[2], s[1], s[0]}, {s[2], s[0]}, {s[1], s[3], s[0]}}
	for i := range 2 {
		db, proxy := open(i)
		db.SetMaxOpenConns(6)
		l.pools, l.proxies = append(l.pools, db), append(l.proxies, proxy)
		for j := range 2 * len(l.muxNames) {
			name := l.muxNames[j%len(l.muxNames)]
			lock := newLock(t, db, name, muxSoakOptions...)
			l.wg.Go(func() { l.worker(ctx, lock, []string{name}, l.mux, &l.longMux, j%2 == 1) })
		}
		for j, names := range sets {
			opts := pinnedSets
			if j%2 == i%2 {
				opts = muxSoakOptions
			}
			set := newSet(t, db, names, opts...)
			l.wg.Go(func() { l.worker(ctx, set, names, l.set, &l.longSet, false) })
		}
	}
	return l
}

// worker runs Do (or, if try, TryDo) on lock, which takes names, until
// ctx ends, holding it for holdBriefly() in each section (or until lost);
// inside a long section, long names it.
func (l *muxLoad) worker(ctx context.Context, lock *advisorylock.Lock, names []string, figs *figures, long *atomic.Pointer[[]string], try bool) {
	for ctx.Err() == nil {
		start := time.Now()
		secs := make([]*section, len(names))
		fn := func(fctx context.Context) error {
			figs.acquiredAfter(time.Since(start))
			who := fmt.Sprintf("Lock %p (try %v), %s", lock, try, advisorylock.GuardOrigin(advisorylock.GuardFromContext(fctx)))
			for i, n := range names {
				secs[i] = l.secs[n].enter(fctx, nil)
				secs[i].who = who
			}
			defer func() {
				for i, n := range names {
					l.secs[n].exit(secs[i])
				}
			}()
			d := holdBriefly()
			if d >= 300*time.Millisecond {
				long.Store(&names)
				defer long.CompareAndSwap(&names, nil)
			}
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		}
		var err error
		if try {
			var ran bool
			if ran, err = lock.TryDo(ctx, fn); !ran && err == nil {
				for _, n := range names {
					l.secs[n].record(start, nil) // history hook
				}
				time.Sleep(40*time.Millisecond + rand.N(60*time.Millisecond)) // a try that missed does not spin on the server
				continue
			}
		} else {
			err = lock.Do(ctx, fn)
		}
		for i, n := range names {
			if secs[i] != nil && err != nil {
				secs[i].tell() // see sessionWorker
			}
			l.secs[n].record(start, secs[i]) // history hook
		}
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "deadlock") {
			figs.violations.Add(1)
			l.secs[names[0]].log("VIOLATION: %s: the set %q deadlocked: %v", l.backend, lock.Name(), err)
		}
		figs.outcome(ctx, err, false)
		time.Sleep(10*time.Millisecond + rand.N(50*time.Millisecond)) // a job's work between holds, which keeps the rows' load light
	}
}

// fault records a session-ending fault on every name of the rows.
func (l *muxLoad) fault() {
	for _, s := range l.secs {
		s.fault()
	}
}

// heal ends every cut and delay.
func (l *muxLoad) heal() {
	for _, p := range l.proxies {
		p.SetDelay(0)
		p.Heal()
	}
}

// injectRound injects one round of the rows' faults (see the top of the
// file), a moment apart.
func (l *muxLoad) injectRound(t *testing.T) {
	if l.killHolder(t, &l.longMux) {
		l.muxKills++
		l.mux.faults.Add(1)
	}
	if l.killHolder(t, &l.longSet) {
		l.setKills++
		l.set.faults.Add(1)
	}
	pause := func() { time.Sleep(200*time.Millisecond + rand.N(300*time.Millisecond)) } // spacing faults, not synchronizing
	pause()
	l.fault()
	l.proxies[rand.IntN(len(l.proxies))].Reset()
	l.resets++
	pause()
	p := l.proxies[rand.IntN(len(l.proxies))]
	p.Cut()
	time.Sleep(1200*time.Millisecond + rand.N(800*time.Millisecond))
	p.Heal()
	l.cuts++
	pause()
	p = l.proxies[rand.IntN(len(l.proxies))]
	p.SetDelay(1200 * time.Millisecond)
	time.Sleep(1500 * time.Millisecond)
	p.SetDelay(0)
	l.delays++
	for _, f := range []*figures{l.mux, l.set} {
		f.faults.Add(3)
	}
}

// killHolder ends the server session that holds the names of a worker
// inside a long section (long), waiting up to 5s for one, and reports
// whether it found one. It fails t with Errorf only: it runs beside the
// test's goroutine (injectMuxRounds).
func (l *muxLoad) killHolder(t *testing.T, long *atomic.Pointer[[]string]) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var pid int
	testdb.Poll(5*time.Second, func() bool {
		names := long.Load()
		if names == nil {
			return false
		}
		h, err := l.probes[(*names)[0]].Holder(ctx)
		if err == nil && h != nil && h.PID != 0 {
			pid = h.PID
			return true
		}
		return false
	})
	if pid == 0 {
		return false
	}
	l.fault()
	if err := l.kill(ctx, l.admin, pid); err != nil {
		t.Errorf("%s: killing session %d: %v", l.backend, pid, err)
		return false
	}
	return true
}

// injectMuxRounds injects a round into each load at once, and returns a
// function that waits for them.
func injectMuxRounds(t *testing.T, loads []*muxLoad) (wait func()) {
	var wg sync.WaitGroup
	for _, l := range loads {
		wg.Go(func() { l.injectRound(t) })
	}
	return wg.Wait
}

// reached reports whether the rows' faults reached both rows: a session
// of each killed and some loss reported by each.
func (l *muxLoad) reached() bool {
	return l.muxKills > 0 && l.setKills > 0 && l.mux.losses.Load() > 0 && l.set.losses.Load() > 0
}

// progresses fails t unless both rows acquire again after the faults.
func (l *muxLoad) progresses(t *testing.T) {
	t.Helper()
	m, s := l.mux.acquired.Load(), l.set.acquired.Load()
	testdb.WaitFor(t, 2*wait, func() bool { return l.mux.acquired.Load() > m+1 && l.set.acquired.Load() > s+1 },
		"%s: no progress after the faults: %d multiplexed and %d set acquisitions since", l.backend, l.mux.acquired.Load()-m, l.set.acquired.Load()-s)
}

// halt heals the network, stops the workers (failing t if they hang) and
// counts the violations.
func (l *muxLoad) halt(t *testing.T) {
	t.Helper()
	l.heal()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, l.backend+" multiplexed and set workers")
	for _, s := range l.secs {
		s.settle()
	}
}

// sections returns the rows' sections, for the history check.
func (l *muxLoad) sections() []*sections {
	var out []*sections
	for _, n := range slices.Concat(l.muxNames, l.setNames) {
		out = append(out, l.secs[n])
	}
	return out
}

func (l *muxLoad) String() string {
	return fmt.Sprintf("killed %d (multiplexed) and %d (sets), reset %d, cut %d, delayed %d", l.muxKills, l.setKills, l.resets, l.cuts, l.delays)
}

// check checks a halted load: no violation, the faults reached both rows,
// nothing left held or checked out.
func (l *muxLoad) check(t *testing.T) {
	t.Helper()
	if v := l.mux.violations.Load() + l.set.violations.Load(); v != 0 {
		t.Errorf("%s multiplexed and set rows: %d violations (see the log)", l.backend, v)
	}
	if !l.reached() || l.mux.acquired.Load() == 0 || l.set.acquired.Load() == 0 {
		t.Errorf("vacuous: %s multiplexed and set rows: faults %v; multiplexed %v; sets %v", l.backend, l, l.mux, l.set)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, n := range slices.Concat(l.muxNames, l.setNames) {
		testdb.WaitFor(t, wait, func() bool {
			h, err := l.probes[n].Holder(ctx)
			return err == nil && h == nil
		}, "%s: %q left held", l.backend, n)
	}
	for i, p := range l.pools {
		testdb.WaitFor(t, wait, func() bool { return p.Stats().InUse == 0 }, "%s pool %d: %d connections left checked out", l.backend, i, p.Stats().InUse)
	}
}

// TestMultiplexedAndSetRowsUnderFaults runs the soak's multiplexed and
// set rows alone for one round of their faults (and more until the faults
// reached both rows): no violation, progress after the faults, a
// linearizable history, nothing left.
func TestMultiplexedAndSetRowsUnderFaults(t *testing.T) {
	testdb.Slow(t, "fault: sessions killed and cut under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	loads := startMuxLoads(t)
	injectMuxRounds(t, loads)()
	for try := 0; try < 5 && slices.ContainsFunc(loads, func(l *muxLoad) bool { return !l.reached() }); try++ {
		injectMuxRounds(t, loads)()
	}
	var secs []*sections
	for _, l := range loads {
		l.progresses(t)
	}
	for _, l := range loads {
		l.halt(t)
		secs = append(secs, l.sections()...)
	}
	checkHistory(t, secs...) // history hook
	for _, l := range loads {
		t.Logf("%s faults: %v", l.backend, l)
		t.Logf("multiplexed Lock on %s: %v", l.backend, l.mux)
		t.Logf("set on %s: %v", l.backend, l.set)
		l.check(t)
	}
}
