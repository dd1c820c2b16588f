package advisorylock_test

// The soak's history: every Do call and fenced write its workers make
// under each lock name, turned into operations with real-time intervals
// for the checker in linearizability_test.go (which describes the model).
//
// What is recorded, through the hooks marked "history hook" in
// fault_test.go and soak_test.go: each Do or TryDo call (when it was
// called and returned, and the section its fn ran, whose enter and exit
// stamp when fn started and returned, and whose told is when the holder
// was first told of a loss); each fenced write (its token, when it began
// and returned, its error); and, as before, the session-ending faults
// (sections.fault).
//
// The operations derived, in ticks (nanoseconds of the wall clock since
// the first record: section.told is kept as Unix nanoseconds, so every
// time is read on that one clock):
//
//   - grant: [Do called, fn started], with the lease's token.
//   - release: [fn returned, Do returned], for a call whose holder was
//     never told of a loss. Whatever the release returned, the holder
//     stopped using the lock when fn returned; a release that never
//     reached the server leaves the lock to the server (the session's
//     end, the lease's expiry), which grants it to no one meanwhile.
//   - loss: [earliest, told], told being when the holder was first told
//     (fn's context cancelled with ErrLockLost, a lease's Lost first
//     closed, a Lock's Do returning an error after its section). earliest
//     is told itself: the library promises that a holder is told before
//     the database can grant its lock to anyone else. Two exceptions make
//     it earlier: on a name with session-ending faults (noticeWithin > 0),
//     the first such fault within noticeWithin before told, since the
//     server frees a lock when its session ends and the holder learns at
//     its next keep-alive (the excuse sections makes); and fn's return,
//     if that came first (the release found the lock gone). Never before
//     the call was made.
//   - an acquire not granted (Do returned without running fn, TryDo found
//     the lock held): counted, not checked (see linearizability_test.go).
//   - admit: [write began, write returned] for a write that returned nil;
//     stale: one refused with ErrStaleToken, with the highest admitted;
//     maybe: one that failed otherwise. Most of those failed before their
//     commit and had no effect, but a failed commit may have committed.
//     A maybe can take effect only until an admitted write with a higher
//     token is linearized, so its response is the earliest response of
//     such a write (never, if there is none); one that began after that
//     cannot have taken effect and is left out.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// history is what one sections recorded under its name.
type history struct {
	mu     sync.Mutex
	calls  []doCall
	writes []writeCall
}

// doCall is one Do or TryDo call.
type doCall struct {
	called, returned time.Time
	sec              *section // the section fn ran; nil if fn did not run
}

// writeCall is one fenced write.
type writeCall struct {
	token           int64
	began, returned time.Time
	err             error
}

// record records a Do (or TryDo) call made at called that ran sec (nil
// if fn did not run) and returns now. Call it once Do has returned and
// sec has been told of any loss.
func (s *sections) record(called time.Time, sec *section) {
	now := time.Now()
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	s.hist.calls = append(s.hist.calls, doCall{called: called, returned: now, sec: sec})
}

// wrote records a fenced write of token that began at began and returns
// err now.
func (s *sections) wrote(token advisorylock.FencingToken, began time.Time, err error) {
	now := time.Now()
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	s.hist.writes = append(s.hist.writes, writeCall{token: int64(token), began: began, returned: now, err: err})
}

// opCounts counts a history's operations by kind.
type opCounts struct {
	acquires, granted, releases, losses int
	writes, admitted, stale, unknown    int
}

func (n *opCounts) add(m opCounts) {
	n.acquires += m.acquires
	n.granted += m.granted
	n.releases += m.releases
	n.losses += m.losses
	n.writes += m.writes
	n.admitted += m.admitted
	n.stale += m.stale
	n.unknown += m.unknown
}

func (n opCounts) String() string {
	return fmt.Sprintf("%d operations: acquires %d (granted %d), releases %d, losses %d, fenced writes %d (admitted %d, stale %d, unknown outcome %d)",
		n.acquires+n.releases+n.losses+n.writes, n.acquires, n.granted, n.releases, n.losses, n.writes, n.admitted, n.stale, n.unknown)
}

// objects returns the operations of s's lock and of its fence (the
// resource of s's name) and counts them. Call it once the workers have
// stopped.
func (s *sections) objects() (lock, fence object, n opCounts) {
	s.mu.Lock()
	faults, within := slices.Clone(s.ended), s.noticeWithin
	s.mu.Unlock()
	s.hist.mu.Lock()
	defer s.hist.mu.Unlock()
	base := int64(math.MaxInt64)
	for _, c := range s.hist.calls {
		base = min(base, c.called.UnixNano())
	}
	for _, w := range s.hist.writes {
		base = min(base, w.began.UnixNano())
	}
	tick := func(at time.Time) int64 { return at.UnixNano() - base }

	lock, fence = object{name: s.name}, object{name: s.name, fence: true}
	for i, c := range s.hist.calls {
		n.acquires++
		if c.sec == nil {
			continue
		}
		n.granted++
		token := c.sec.token()
		end := c.end(i+1, faults, within, tick)
		if end.kind == opLoss {
			n.losses++
		} else {
			n.releases++
		}
		lock.ops = append(lock.ops, grantOp(i+1, tick(c.called), tick(c.sec.entered), token), end)
	}
	for _, w := range s.hist.writes {
		n.writes++
		highest, refused := staleHighest(w.err)
		switch {
		case w.err == nil:
			n.admitted++
			fence.ops = append(fence.ops, admitOp(tick(w.began), tick(w.returned), w.token))
		case refused:
			n.stale++
			fence.ops = append(fence.ops, staleOp(tick(w.began), tick(w.returned), w.token, int64(highest)))
		default:
			n.unknown++
			fence.ops = append(fence.ops, maybeOp(tick(w.began), never, w.token))
		}
	}
	fence.ops = boundMaybes(fence.ops)
	return lock, fence, n
}

// end returns the release or loss that ended call id's hold (see the
// file's comment), in ticks.
func (c doCall) end(id int, faults []time.Time, within time.Duration, tick func(time.Time) int64) op {
	n := c.sec.told.Load()
	if n == 0 {
		return releaseOp(id, tick(c.sec.exited), tick(c.returned))
	}
	told := time.Unix(0, n)
	earliest := told
	for _, f := range faults {
		if within > 0 && !f.After(told) && told.Sub(f) <= within && f.Before(earliest) {
			earliest = f
		}
	}
	if c.sec.exited.Before(earliest) {
		earliest = c.sec.exited
	}
	if earliest.Before(c.called) {
		earliest = c.called
	}
	return lossOp(id, tick(earliest), tick(told))
}

// boundMaybes gives each write of unknown outcome the response described
// in the file's comment, and leaves out those that cannot have taken
// effect.
func boundMaybes(ops []op) []op {
	var out []op
	for _, o := range ops {
		if o.kind == opMaybe {
			for _, a := range ops {
				if a.kind == opAdmit && a.token > o.token {
					o.response = min(o.response, a.response)
				}
			}
			if o.response < o.invoke {
				continue
			}
		}
		out = append(out, o)
	}
	return out
}

// historyBudget bounds the check of one object of n operations. The
// soak's histories are nearly sequential: a few nodes per operation.
func historyBudget(n int) budget { return budget{nodes: 100_000 + 200*n, time: 2 * time.Minute} }

// checkHistory checks the history each of secs recorded, lock and fence,
// and logs one line: the operations checked by kind, the names, the
// result. A history that is not linearizable fails t and prints its
// smallest offending window; a search out of budget fails t too. Call it
// once the loads have halted.
func checkHistory(t *testing.T, secs ...*sections) {
	t.Helper()
	began := time.Now()
	var n opCounts
	names := map[string]bool{}
	result := "linearizable"
	for _, s := range secs {
		lock, fence, c := s.objects()
		n.add(c)
		names[s.name] = true
		for _, o := range []object{lock, fence} {
			what := "lock"
			if o.fence {
				what = "fence"
			}
			r := o.check(historyBudget(len(o.ops)))
			switch {
			case r.gaveUp:
				result = "NOT CHECKED (search out of budget)"
				t.Errorf("history of the %s %q: the search gave up after %d nodes on %d operations: not checked", what, o.name, r.nodes, len(o.ops))
			case !r.ok:
				result = "NOT LINEARIZABLE"
				t.Errorf("history of the %s %q (%d operations) is not linearizable; its smallest offending window found, %d operations:%s",
					what, o.name, len(o.ops), len(r.window), describe(r.window, 40))
			}
		}
	}
	t.Logf("history of %d names (locks and their fences), %v: %s, checked in %v",
		len(names), n, result, time.Since(began).Round(time.Millisecond))
}

// TestHistoryDerivesIntervalsFromWhatTheWorkersSaw: each kind of record
// becomes the operation the file's comment describes.
func TestHistoryDerivesIntervalsFromWhatTheWorkersSaw(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(1000, ms*int64(time.Millisecond)) }
	tk := func(ms int64) int64 { return ms * int64(time.Millisecond) } // ticks: the first call is at 0
	sec := func(entered, exited, told int64) *section {
		sec := &section{entered: at(entered), exited: at(exited)}
		if told >= 0 {
			sec.told.Store(at(told).UnixNano())
		}
		return sec
	}
	s := newSections("name", &figures{}, t.Logf).sessionFaults(3 * time.Second)
	s.ended = []time.Time{at(6020), at(9800)}
	s.hist.calls = []doCall{
		{called: at(0), returned: at(30), sec: sec(10, 20, -1)},                 // released
		{called: at(100), returned: at(200), sec: nil},                          // not granted
		{called: at(300), returned: at(400), sec: sec(310, 350, 340)},           // told during fn, no fault near
		{called: at(500), returned: at(600), sec: sec(510, 550, 590)},           // told after fn returned
		{called: at(6000), returned: at(7100), sec: sec(6010, 7050, 7000)},      // told 0.98s after a fault
		{called: at(9900), returned: at(9990), sec: sec(9910, 9950, 9940)},      // the fault came before the call
		{called: at(14000), returned: at(14100), sec: sec(14010, 14050, 14040)}, // the last fault 4.24s before: too long
	}
	s.hist.writes = []writeCall{
		{token: 3, began: at(20), returned: at(25)},
		{token: 2, began: at(30), returned: at(35), err: advisorylock.StaleTokenErr("name", 2, 3)},
		{token: 3, began: at(40), returned: at(45), err: errors.New("commit: connection reset")},
		{token: 4, began: at(50), returned: at(55)},
		{token: 2, began: at(60), returned: at(65), err: errors.New("begin: connection reset")}, // after 4 was admitted: no effect
		{token: 5, began: at(70), returned: at(75), err: errors.New("commit: connection reset")},
	}
	lock, fence, n := s.objects()
	wantLock := []op{
		grantOp(1, tk(0), tk(10), 0), releaseOp(1, tk(20), tk(30)),
		grantOp(3, tk(300), tk(310), 0), lossOp(3, tk(340), tk(340)),
		grantOp(4, tk(500), tk(510), 0), lossOp(4, tk(550), tk(590)),
		grantOp(5, tk(6000), tk(6010), 0), lossOp(5, tk(6020), tk(7000)),
		grantOp(6, tk(9900), tk(9910), 0), lossOp(6, tk(9900), tk(9940)),
		grantOp(7, tk(14000), tk(14010), 0), lossOp(7, tk(14040), tk(14040)),
	}
	if !slices.Equal(lock.ops, wantLock) {
		t.Errorf("lock operations:%s\nwant:%s", describe(lock.ops, 20), describe(wantLock, 20))
	}
	wantFence := []op{
		admitOp(tk(20), tk(25), 3), staleOp(tk(30), tk(35), 2, 3), maybeOp(tk(40), tk(55), 3),
		admitOp(tk(50), tk(55), 4), maybeOp(tk(70), never, 5),
	}
	if !slices.Equal(fence.ops, wantFence) {
		t.Errorf("fence operations:%s\nwant:%s", describe(fence.ops, 20), describe(wantFence, 20))
	}
	want := opCounts{acquires: 7, granted: 6, releases: 1, losses: 5, writes: 6, admitted: 2, stale: 1, unknown: 3}
	if n != want {
		t.Errorf("counts %v, want %v", n, want)
	}
}

// TestHistoryExcusesALossOnlyWithinTheNoticeWindow: a session lock's
// holder killed by a fault may be succeeded before it is told, if it is
// told within noticeWithin of the fault; not otherwise.
func TestHistoryExcusesALossOnlyWithinTheNoticeWindow(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(1000, ms*int64(time.Millisecond)) }
	for _, tc := range []struct {
		name   string
		within time.Duration // the name's noticeWithin: 0, no session-ending faults
		fault  int64         // ms
		ok     bool
	}{
		{"a fault before the successor's grant, told 1.5s after it", 3 * time.Second, 500, true},
		{"a fault, told 3.5s after it", 3 * time.Second, -1500, false},
		{"a fault only after the successor's grant", 3 * time.Second, 1500, false},
		{"a name without session-ending faults", 0, 500, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSections("name", &figures{}, t.Logf).sessionFaults(tc.within)
			s.ended = []time.Time{at(tc.fault)}
			// The holder is told at 2s; its successor was granted at 1s.
			older := &section{entered: at(10), exited: at(2010)}
			older.told.Store(at(2000).UnixNano())
			newer := &section{entered: at(1000), exited: at(1100)}
			s.hist.calls = []doCall{
				{called: at(0), returned: at(2020), sec: older},
				{called: at(50), returned: at(1120), sec: newer},
			}
			lock, _, _ := s.objects()
			r := lock.check(testBudget)
			if r.gaveUp || r.ok != tc.ok {
				t.Fatalf("linearizable %v (gave up %v), want %v; operations:%s", r.ok, r.gaveUp, tc.ok, describe(lock.ops, 10))
			}
		})
	}
}

// TestSectionsExcuseASessionGrantThatStartedLate: of two session locks'
// sections that overlap, the one entered second may hold the older grant
// (its fn started late), lost with its session before the other's grant.
// The sections' check excuses that as the history check does, and counts
// an overlap that no fault explains either way.
func TestSectionsExcuseASessionGrantThatStartedLate(t *testing.T) {
	at := func(ms int64) time.Time { return time.Unix(1000, ms*int64(time.Millisecond)) }
	for _, tc := range []struct {
		name   string
		fault  int64 // ms; -1: none
		told   int64 // ms, when the section entered second was told; -1: never
		excuse bool
	}{
		{"the second section's session ended before the first's grant, told 1s after", 400, 1400, true},
		{"the second section told, no fault", -1, 1400, false},
		{"the second section's session ended only during the overlap", 700, 1400, false},
		{"the second section told 3.5s after the fault", 400, 3900, false},
		{"neither told", 400, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSections("name", &figures{}, t.Logf).sessionFaults(3 * time.Second)
			if tc.fault >= 0 {
				s.ended = []time.Time{at(tc.fault)}
			}
			// The first section runs from 500 to 2000, never told; the
			// second's call began at 100, before it, and its fn ran from
			// 600 to 1500.
			first := &section{granted: at(500), entered: at(500), exited: at(2000)}
			second := &section{granted: at(600), entered: at(600), exited: at(1500)}
			if tc.told >= 0 {
				second.told.Store(at(tc.told).UnixNano())
			}
			s.pairs = [][2]*section{{first, second}}
			s.hist.calls = []doCall{
				{called: at(100), returned: at(1600), sec: second},
				{called: at(450), returned: at(2010), sec: first},
			}
			s.settle()
			if got := s.figs.violations.Load() == 0; got != tc.excuse {
				t.Errorf("excused %v, want %v", got, tc.excuse)
			}
			lock, _, _ := s.objects()
			if r := lock.check(testBudget); r.gaveUp || r.ok != tc.excuse {
				t.Errorf("history linearizable %v (gave up %v), want %v as the sections' check; operations:%s", r.ok, r.gaveUp, tc.excuse, describe(lock.ops, 10))
			}
		})
	}
}

// checkCounter allows in the counter row only what the sections excused:
// as many overlaps as they excused, at most one bump lost to each, and
// nobody left inside.
func TestCounterCheckAllowsOnlyWhatTheSectionsExcused(t *testing.T) {
	for _, tc := range []struct {
		name      string
		excused   int
		lost      int64 // of three bumps counted
		leftIn    bool
		violation bool
	}{
		{"an overlap the sections excused, a bump lost to it", 1, 1, false, false},
		{"an overlap the sections did not excuse", 0, 0, false, true},
		{"two bumps lost to one excused overlap", 1, 2, false, true},
		{"a holder left inside", 1, 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteLoadOptions)
			c := testdb.NewCounter(t, db, true)
			for want := range int64(2) { // two holders inside at once
				if inside, err := c.Enter(ctx, db); err != nil || inside != want+1 {
					t.Fatalf("enter: %d inside, %v", inside, err)
				}
			}
			for range 3 - tc.lost {
				if err := c.Bump(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			exits := 2
			if tc.leftIn {
				exits = 1
			}
			for range exits {
				if err := c.Exit(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			s := newSections("name", &figures{}, t.Logf)
			s.excusedPairs = tc.excused
			s.checkCounter(t, "test", c, db, 3)
			if got := s.figs.violations.Load() != 0; got != tc.violation {
				t.Errorf("violation %v, want %v", got, tc.violation)
			}
		})
	}
}
