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
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// The soak's semaphore row (see TestSoak): on PostgreSQL (lib/pq and
// pgx), MariaDB, SQLite and lease rows through PgBouncer's transaction
// pool (WithLeaseRows), workers with a pool each run Do, TryDo and
// Acquire on a semaphore of semSoakSlots slots, and every round a holder's
// server session is ended (pg_terminate_backend, KILL). A violation is
// more holders inside than slots, or two holders on one slot, unless the
// extra holders had lost their slot to such a fault and were told within
// semNoticeWithin of it (the server frees a killed session's slot at once;
// its holder learns of it at its next keep-alive), or had been told of
// the loss before the newcomer was granted (a lease whose renewals a
// loaded machine held up past its local deadline: SQLite's and the lease
// rows' slots are leases, and no fault is injected there). The newcomer
// itself may be the one that lost its slot: granted, its session ended
// by a fault, and fn started late (a loaded machine) after another holder
// had taken the freed slot; that excess is excused the same way, by the
// newcomer's being told (as the sections of fault_test.go excuse two
// session locks entered in the other order). A holder is told by
// fn's context, its guard's Lost channel or its Do's (or release's)
// error, or else by the Observer's Lost event: a holder that left its
// section before the keep-alive saw the loss releases a lost guard
// without an error, but the library did notice.

// semNoticeWithin only ties a told holder to the fault that freed its
// slot: an overlap the library causes tells no one, whatever the window.
// It is long because the soak runs beside the whole suite under the race
// detector, where a 200ms keep-alive has been seen to run seconds late;
// how soon a killed holder learns of it is measured by the fault tests.
const (
	semSoakSlots    = 2
	semSoakWorkers  = 4
	semNoticeWithin = 10 * time.Second
)

// semaphoreLoad is the semaphore workers of every backend.
type semaphoreLoad struct {
	rows []*semRow
	figs *figures // all rows together
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// semRow is the semaphore workers of one backend, and what they saw.
type semRow struct {
	backend string
	admin   *sql.DB
	sem     *advisorylock.Semaphore // the admin's, for Holders
	figs    *figures

	mu     sync.Mutex
	inside map[*semHolder]struct{}
	grants int         // holders that entered
	ended  []time.Time // session-ending faults, when injected
	excess []semExcess
}

// semHolder is one holder inside its section. told is when it was told
// of a loss (see the top of the file).
type semHolder struct {
	slot    int // -1 where fn does not know it (Do, TryDo)
	granted time.Time
	exited  atomic.Int64 // unix nanoseconds when it left its section; 0 while inside
	told    atomic.Int64 // unix nanoseconds when told of a loss; 0 if never
}

// tell records that h was told of a loss now, if it was not before.
func (h *semHolder) tell() { h.told.CompareAndSwap(0, time.Now().UnixNano()) }

// semHolderKey carries a worker's holder in the context of its acquire,
// which the Observer's events get.
type semHolderKey struct{}

// semTeller is the soak semaphores' Observer: a loss the library noticed
// tells the holder it was found for.
type semTeller struct{}

func (semTeller) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	if e.Type != "loss" {
		return ctx
	}
	if h, ok := ctx.Value(semHolderKey{}).(*semHolder); ok {
		h.tell()
	}
	return ctx
}

// String describes h relative to a fault at fault, for a violation's log.
func (h *semHolder) String(fault time.Time) string {
	since := func(n int64) string {
		if n == 0 {
			return "never"
		}
		return time.Unix(0, n).Sub(fault).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("{slot %d, granted %v, told %s, left %s after the fault}",
		h.slot, h.granted.Sub(fault).Round(time.Millisecond), since(h.told.Load()), since(h.exited.Load()))
}

// semExcess is a grant that made more holders than slots (or two on one
// slot): over of the holders inside (the others or the newcomer) must
// have been lost to a fault.
type semExcess struct {
	at       time.Time
	newcomer *semHolder
	others   []*semHolder
	over     int
}

// startSemaphoreLoad starts the semaphore row on the named backends
// ("postgres", "mysql", "sqlite", semRowsBackend), on all of them if none
// is named.
func startSemaphoreLoad(t *testing.T, backends ...string) *semaphoreLoad {
	t.Helper()
	l := &semaphoreLoad{figs: &figures{}}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { stop(); l.wg.Wait() })
	pgDSN, myDSN, litePath := testdb.PostgresDSN(t), testdb.MySQLDSN(t), testdb.SQLitePath(t)
	txDSN, _ := testdb.PgBouncer(t)
	opens := map[string]func(i int) *sql.DB{
		"postgres": func(i int) *sql.DB { return testdb.OpenPostgresDSN(t, testdb.Drivers[i%len(testdb.Drivers)], pgDSN) },
		"mysql":    func(int) *sql.DB { return testdb.OpenMySQLDSN(t, myDSN) },
		"sqlite":   func(int) *sql.DB { return testdb.OpenSQLite(t, litePath, sqliteLoadOptions) },
		semRowsBackend: func(i int) *sql.DB {
			if i%2 == 0 {
				return testdb.OpenPostgresDSN(t, "postgres", txDSN)
			}
			return testdb.OpenPostgresDSN(t, "pgx", txDSN+"&default_query_exec_mode=exec")
		},
	}
	opts := []advisorylock.Option{quiet, advisorylock.WithObserver(semTeller{}), advisorylock.WithKeepAlive(200 * time.Millisecond),
		advisorylock.WithPollInterval(5 * time.Millisecond), advisorylock.WithLeaseTTL(3 * time.Second)}
	if len(backends) == 0 {
		backends = []string{"postgres", "mysql", "sqlite", semRowsBackend}
	}
	for _, backend := range backends {
		name := testdb.UniqueName(t)
		admin := opens[backend](0)
		o := opts
		if backend == semRowsBackend {
			o = append(slices.Clone(opts), advisorylock.WithLeaseRows())
		}
		r := &semRow{backend: backend, admin: admin, sem: newSemaphore(t, admin, name, semSoakSlots, o...), figs: l.figs, inside: map[*semHolder]struct{}{}}
		l.rows = append(l.rows, r)
		for i := range semSoakWorkers {
			s := newSemaphore(t, opens[backend](i), name, semSoakSlots, o...)
			l.wg.Go(func() { r.work(ctx, s) })
		}
	}
	return l
}

// semRowsBackend is the semaphore row on lease rows (WithLeaseRows)
// through PgBouncer's transaction pool, with lib/pq and pgx in exec mode:
// its slots are leases, like SQLite's, so it gets no session-ending
// fault.
const semRowsBackend = "rows via PgBouncer"

// work takes a slot one of three ways until ctx ends.
func (r *semRow) work(ctx context.Context, s *advisorylock.Semaphore) {
	for ctx.Err() == nil {
		start := time.Now()
		h := &semHolder{slot: -1}
		hctx := context.WithValue(ctx, semHolderKey{}, h)
		var err error
		switch rand.IntN(3) {
		case 0:
			err = s.Do(hctx, func(fctx context.Context) error { return r.section(fctx, nil, h, start) })
		case 1:
			_, err = s.TryDo(hctx, func(fctx context.Context) error { return r.section(fctx, nil, h, start) })
		default:
			var g *advisorylock.Guard
			if g, err = s.Acquire(hctx); err == nil {
				h.slot = g.Slot()
				err = r.section(hctx, g.Lost(), h, start)
				err = errors.Join(err, g.Release(hctx))
			}
		}
		if err != nil {
			// A holder that ended its section before it noticed the loss
			// is told by its Do's (or release's) error.
			h.tell()
		}
		r.figs.outcome(ctx, err, false)
	}
}

// section runs one holder's section: enters, holds a while (ending early
// when told of a loss), exits. lost is the guard's Lost channel where fn
// has a guard; else fctx's cancellation with cause ErrLockLost tells.
func (r *semRow) section(fctx context.Context, lost <-chan struct{}, h *semHolder, start time.Time) error {
	r.figs.acquiredAfter(time.Since(start))
	// Lost before the section began: told before it enters, not when
	// AfterFunc's goroutine or the select below gets to it.
	stop := tellOnLoss(fctx, h.tell)
	select {
	case <-lost:
		h.tell()
	default:
	}
	r.enter(h)
	defer r.exit(h)
	defer stop()
	select {
	case <-time.After(holdBriefly()):
		return nil
	case <-lost:
		h.tell()
		return fmt.Errorf("slot lost: %w", advisorylock.ErrLockLost)
	case <-fctx.Done():
		return context.Cause(fctx)
	}
}

// enter records h inside, and an excess if it makes one.
func (r *semRow) enter(h *semHolder) {
	h.granted = time.Now()
	slot := h.slot
	r.mu.Lock()
	defer r.mu.Unlock()
	var others, sameSlot []*semHolder
	for o := range r.inside {
		others = append(others, o)
		if slot >= 0 && o.slot == slot {
			sameSlot = append(sameSlot, o)
		}
	}
	if len(others)+1 > semSoakSlots {
		r.excess = append(r.excess, semExcess{at: h.granted, newcomer: h, others: others, over: len(others) + 1 - semSoakSlots})
	}
	if len(sameSlot) > 0 {
		r.excess = append(r.excess, semExcess{at: h.granted, newcomer: h, others: sameSlot, over: len(sameSlot)})
	}
	r.inside[h] = struct{}{}
	r.grants++
}

func (r *semRow) exit(h *semHolder) {
	h.exited.Store(time.Now().UnixNano())
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inside, h)
}

// injectRound ends the server session of one holder of each session
// backend's semaphore, if one holds a slot now.
func (l *semaphoreLoad) injectRound(t *testing.T) {
	for _, r := range l.rows {
		if r.backend == "sqlite" || r.backend == semRowsBackend {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		hs, err := r.sem.Holders(ctx)
		cancel()
		if err != nil || len(hs) == 0 {
			continue
		}
		kill := fmt.Sprintf("SELECT pg_terminate_backend(%d)", hs[0].PID)
		if r.backend == "mysql" {
			kill = fmt.Sprintf("KILL %d", hs[0].PID)
		}
		r.mu.Lock()
		r.ended = append(r.ended, time.Now())
		r.mu.Unlock()
		if _, err := r.admin.Exec(kill); err != nil {
			t.Logf("semaphore soak: %s: %v", kill, err)
			continue
		}
		r.figs.faults.Add(1)
	}
}

// halt stops the workers and counts the violations: excesses that no
// fault explains.
func (l *semaphoreLoad) halt(t *testing.T) {
	t.Helper()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "semaphore workers")
	for _, r := range l.rows {
		for _, e := range r.excess {
			if fault, ok := r.excused(e); !ok {
				l.figs.violations.Add(1)
				var others []string
				for _, o := range e.others {
					others = append(others, o.String(fault))
				}
				t.Logf("VIOLATION: semaphore on %s: at %v, %d more holders than slots (or on one slot), not lost to a fault; last fault before it at %v; the newcomer %s; the holders inside: %v",
					r.backend, e.at.Format(time.StampMicro), e.over, fault.Format(time.StampMicro), e.newcomer.String(fault), others)
			}
		}
	}
}

// excused reports whether at least e.over of the holders inside at e
// (the newcomer among them) had been told of a loss before e's grant, or
// within semNoticeWithin of the last session-ending fault injected before
// e; and that fault's time (zero if none).
func (r *semRow) excused(e semExcess) (time.Time, bool) {
	var fault time.Time
	for _, f := range r.ended {
		if f.Before(e.at) {
			fault = f
		}
	}
	told := 0
	for _, o := range append(slices.Clone(e.others), e.newcomer) {
		n := o.told.Load()
		switch {
		case n == 0:
		case !time.Unix(0, n).After(e.at):
			told++
		case !fault.IsZero() && time.Unix(0, n).Before(fault.Add(semNoticeWithin)):
			told++
		}
	}
	return fault, told >= e.over
}

// check checks a halted load: no violation, no slot left held.
func (l *semaphoreLoad) check(t *testing.T) {
	t.Helper()
	if v := l.figs.violations.Load(); v != 0 {
		t.Errorf("semaphores: %d violations (see the log)", v)
	}
	for _, r := range l.rows {
		r.mu.Lock()
		grants := r.grants
		r.mu.Unlock()
		if grants == 0 {
			t.Errorf("vacuous: the semaphore on %s never granted a slot", r.backend)
		}
		var hs []*advisorylock.Holder
		testdb.WaitFor(t, wait, func() bool {
			var err error
			hs, err = r.sem.Holders(context.Background())
			return err == nil && len(hs) == 0
		}, "semaphore on %s: slots still held after the workers stopped: %v", r.backend, hs)
	}
}

// The semaphore row's check excuses an excess only by a loss that someone
// inside was told of: a holder already inside, or the newcomer itself (its
// session killed after its grant, its fn started late, after another
// holder took the freed slot); a tell that no fault or earlier loss
// explains excuses nothing.
func TestSemaphoreSoakExcusesOnlyATold(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(1000, ms*int64(time.Millisecond)) }
	told := func(ms int64) *semHolder {
		h := &semHolder{slot: -1}
		if ms >= 0 {
			h.told.Store(at(ms).UnixNano())
		}
		return h
	}
	for _, tc := range []struct {
		name            string
		fault           int64 // ms; -1: none
		older, newcomer int64 // when told, ms; -1: never
		excuse          bool
	}{
		{"the newcomer's session ended before it entered, told 800ms after", 400, -1, 1200, true},
		{"a holder inside told within the window of the fault", 400, 1200, -1, true},
		{"a holder inside told before the newcomer entered, no fault", -1, 550, -1, true},
		{"the newcomer told, no fault", -1, -1, 1200, false},
		{"the newcomer told before it entered, no fault (a lease lost before fn)", -1, -1, 590, true},
		{"the newcomer told 11s after the fault", 400, -1, 11500, false},
		{"no one told", 400, -1, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &semRow{}
			if tc.fault >= 0 {
				r.ended = []time.Time{at(tc.fault)}
			}
			// Two holders inside on two slots, one never told; the
			// newcomer enters at 600.
			e := semExcess{at: at(600), newcomer: told(tc.newcomer), others: []*semHolder{told(-1), told(tc.older)}, over: 1}
			if _, got := r.excused(e); got != tc.excuse {
				t.Errorf("excused %v, want %v", got, tc.excuse)
			}
		})
	}
}
