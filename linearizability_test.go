package advisorylock_test

// A linearizability checker for the histories the soak records
// (history_test.go), against one model: a lock plus a fence register.
//
// The model. A lock name is a lock: free, or held by one Do call, and it
// remembers the highest lease token it granted. A fenced resource is a
// register holding the highest token its Fence admitted (0 before the
// first). The operations:
//
//	grant(c, t)   the acquire of Do call c was granted, with lease token t
//	              (0 for a Lock): only while the lock is free and, for a
//	              lease, only with t above every token granted before it
//	              (tokens strictly increase and are never reused); the
//	              holder becomes c.
//	release(c)    c gave the lock back;
//	loss(c)       the lock was taken from c (a fault, an expired lease):
//	              both only while c holds it; the lock becomes free.
//	admit(t)      a fenced write the fence admitted: only with t >= the
//	              register; the register becomes t.
//	stale(t, h)   a fenced write the fence refused: only with t < the
//	              register, and the register = h where h (the highest
//	              token, read back in the refused transaction) is known.
//	maybe(t)      a fenced write whose outcome is unknown (its commit
//	              failed): admit(t), or nothing at all.
//
// Acquires that were not granted are not operations of the model: "held
// elsewhere" is no evidence against it, since the database may still
// hold a lock whose holder was told it lost it (a cut-off session lives
// on until the server ends it, a lost lease's row until it expires).
//
// A history is a set of operations, each with its real-time interval
// [invoke, response] (history_test.go says how the recorder derives
// them; a loss's interval runs from the earliest moment the lock can
// have been taken to the moment its holder was told). It is linearizable
// if each operation can be given a point within its interval such that
// the operations, in the order of their points, are a run of the model.
//
// Locality (Herlihy and Wing, 1990): a history is linearizable if and
// only if the sub-history of each object is. No operation touches both a
// lock and a register, so each lock name and each fenced resource is
// checked alone, which keeps the searches small.
//
// The search is Wing and Gong's, with Lowe's memoization, as Porcupine
// does it: operations sorted by invoke; a depth-first search that
// linearizes, one at a time, an operation that may come next (no pending
// operation responded before it was invoked), in every state the model
// allows; a set of (linearized operations, state) pairs already explored
// prunes the search. It is exact: it answers "not linearizable" only when
// no order exists. It is exponential in the worst case, so it runs on a
// budget (nodes and time); running out is its own answer, which the soak
// reports as a failure, never as a pass.
//
// When a history is not linearizable, the checker looks for the smallest
// offending window: the shortest run of whole units (a Do call's grant
// and free together; a single fenced write) that still cannot be
// linearized from any start state. A lock's history stays linearizable
// when whole calls are removed, so any run of calls may be cut out; a
// register's only at real-time cuts (every operation before the cut
// responded before any after it was invoked), because an admitted write
// removed from the middle may be what explains a refusal.

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// opKind is what an operation of a history did.
type opKind int

const (
	opGrant opKind = iota
	opRelease
	opLoss
	opAdmit
	opStale
	opMaybe
)

var opKindNames = [...]string{"grant", "release", "loss", "admit", "stale", "maybe"}

func (k opKind) String() string { return opKindNames[k] }

// never is the response of an operation that may take effect at any time
// after its invoke: a fenced write of unknown outcome that nothing bounds.
const never = math.MaxInt64

// op is one operation of one object's history. Times are ticks: the
// recorder's are nanoseconds since its first record; hand-made histories
// use any unit.
type op struct {
	kind             opKind
	call             int // grants and frees: the Do call (from 1)
	invoke, response int64
	token            int64 // grants: the lease's (0 for a Lock); writes: the write's
	highest          int64 // opStale: the register read back; 0 if not known
}

func (o op) String() string {
	at := func(t int64) string {
		if t == never {
			return "never"
		}
		return fmt.Sprintf("%.3fms", float64(t)/1e6)
	}
	s := fmt.Sprintf("%-7v [%s, %s]", o.kind, at(o.invoke), at(o.response))
	switch o.kind {
	case opGrant, opRelease, opLoss:
		s = fmt.Sprintf("call %d: %s", o.call, s)
		if o.token != 0 {
			s += fmt.Sprintf(" token %d", o.token)
		}
	case opStale:
		s += fmt.Sprintf(" token %d, highest %d", o.token, o.highest)
	default:
		s += fmt.Sprintf(" token %d", o.token)
	}
	return s
}

// free is the holder of a free lock.
const free = 0

// state is the model's state. A lock's history uses holder and last, a
// register's fence and exact.
type state struct {
	holder int   // the Do call that holds the lock, or free
	last   int64 // the highest lease token granted
	fence  int64 // the register: the highest token admitted
	exact  bool  // fence is the register's value; false: only a lower bound (a window's start, unknown)
}

// apply returns the states o can lead to from s; none if o cannot come
// next in s.
func (s state) apply(o op) []state {
	switch o.kind {
	case opGrant:
		if s.holder != free || o.token != 0 && o.token <= s.last {
			return nil
		}
		s.holder, s.last = o.call, max(s.last, o.token)
	case opRelease, opLoss:
		if s.holder != o.call {
			return nil
		}
		s.holder = free
	case opAdmit:
		// Exact or a lower bound alike: t must not be below it.
		if o.token < s.fence {
			return nil
		}
		s.fence, s.exact = o.token, true
	case opStale:
		switch {
		case s.exact && (o.token >= s.fence || o.highest != 0 && o.highest != s.fence):
			return nil
		case s.exact:
		case o.highest != 0: // the unknown start value was highest
			if o.highest <= o.token || o.highest < s.fence {
				return nil
			}
			s.fence, s.exact = o.highest, true
		default: // the unknown start value was above the token
			s.fence = max(s.fence, o.token+1)
		}
	case opMaybe:
		admitted := o
		admitted.kind = opAdmit
		return append(s.apply(admitted), s)
	}
	return []state{s}
}

// budget bounds a search.
type budget struct {
	nodes int           // search nodes
	time  time.Duration // wall-clock time
}

// verdict is a search's answer.
type verdict struct {
	ok     bool // a linearization exists
	gaveUp bool // the budget ran out before an answer
	nodes  int  // search nodes visited
}

// linearize searches for a linearization of ops (sorted by invoke) from
// start.
func linearize(ops []op, start state, b budget) verdict {
	began := time.Now()
	x := &search{ops: ops, done: make([]uint64, len(ops)/64+1)}
	seen := map[memoKey]struct{}{}
	type node struct {
		op, prevFirst int // the operation linearized to get here (-1: the root), and first before it
		top           int // the highest operation linearized so far
		moves         []move
		tried         int
	}
	stack := []*node{{op: -1, top: -1, moves: x.next(start)}}
	for nodes := 1; len(stack) > 0; {
		nd := stack[len(stack)-1]
		if nd.tried == len(nd.moves) { // a dead end: back up
			stack = stack[:len(stack)-1]
			if nd.op >= 0 {
				x.undo(nd.op, nd.prevFirst)
			}
			continue
		}
		m := nd.moves[nd.tried]
		nd.tried++
		prevFirst := x.do(m.op)
		if x.count == len(ops) {
			return verdict{ok: true, nodes: nodes}
		}
		top := max(nd.top, m.op)
		k := x.key(top, m.s)
		if _, ok := seen[k]; ok { // explored before, from another order
			x.undo(m.op, prevFirst)
			continue
		}
		seen[k] = struct{}{}
		if nodes++; nodes > b.nodes || nodes%1024 == 0 && time.Since(began) > b.time {
			return verdict{gaveUp: true, nodes: nodes}
		}
		stack = append(stack, &node{op: m.op, prevFirst: prevFirst, top: top, moves: x.next(m.s)})
	}
	return verdict{ok: len(ops) == 0}
}

// search is the state of one linearize: which operations are linearized
// on the current path.
type search struct {
	ops   []op
	done  []uint64 // bit i: ops[i] is linearized
	first int      // the lowest operation not linearized
	count int      // how many are
}

// move is a step the search may take: linearize op, leading to s.
type move struct {
	op int
	s  state
}

// memoKey is a node of the search: the operations linearized, and the
// state they led to.
type memoKey struct {
	set string
	s   state
}

func (x *search) isDone(i int) bool { return x.done[i/64]&(1<<(i%64)) != 0 }

// do linearizes ops[i] and returns first as it was, for undo.
func (x *search) do(i int) (prevFirst int) {
	prevFirst = x.first
	x.done[i/64] |= 1 << (i % 64)
	x.count++
	for x.first < len(x.ops) && x.isDone(x.first) {
		x.first++
	}
	return prevFirst
}

func (x *search) undo(i, prevFirst int) {
	x.done[i/64] &^= 1 << (i % 64)
	x.count--
	x.first = prevFirst
}

// next lists the moves from state s: every pending operation invoked no
// later than the earliest response of a pending one, in every state the
// model lets it lead to. The scan stops at the first operation invoked
// after the earliest response so far; each one before it was invoked no
// later than that response (operations are in invoke order and respond
// after they are invoked), so all of them may come next.
func (x *search) next(s state) []move {
	earliest, end := int64(never), x.first
	for ; end < len(x.ops) && x.ops[end].invoke <= earliest; end++ {
		if !x.isDone(end) {
			earliest = min(earliest, x.ops[end].response)
		}
	}
	var moves []move
	for i := x.first; i < end; i++ {
		if x.isDone(i) {
			continue
		}
		for _, s2 := range s.apply(x.ops[i]) {
			moves = append(moves, move{i, s2})
		}
	}
	return moves
}

// key returns the node of the search at state s, top being the highest
// operation linearized: the set is first and the bits from first to top
// (all below first are in, all above top are out), so a key is as long
// as the operations in flight, not the history.
func (x *search) key(top int, s state) memoKey {
	buf := binary.LittleEndian.AppendUint64(nil, uint64(x.first))
	for w := x.first / 64; top >= 0 && w <= top/64; w++ {
		buf = binary.LittleEndian.AppendUint64(buf, x.done[w])
	}
	return memoKey{string(buf), s}
}

// object is one object's history: a lock name's grants and frees, or a
// fenced resource's writes.
type object struct {
	name  string
	fence bool // a register, else a lock
	ops   []op
}

// result is what checking an object found.
type result struct {
	verdict
	window []op // not linearizable: the smallest offending window found
}

// check checks o's history from the model's start (a free lock, a
// register at 0), and looks for the smallest offending window if it is
// not linearizable.
func (o object) check(b budget) result {
	ops := sortedOps(o.ops)
	r := result{verdict: linearize(ops, state{exact: true}, b)}
	if !r.ok && !r.gaveUp {
		r.window = smallestWindow(o.units(), !o.fence, b)
	}
	return r
}

// units splits o's history into the pieces a window is made of, in
// invoke order: a lock's calls (a grant and its free), a register's
// writes.
func (o object) units() [][]op {
	var units [][]op
	ofCall := map[int]int{} // a lock's call: its unit
	for _, x := range sortedOps(o.ops) {
		if i, ok := ofCall[x.call]; ok && !o.fence {
			units[i] = append(units[i], x)
			continue
		}
		ofCall[x.call] = len(units)
		units = append(units, []op{x})
	}
	return units
}

// smallestWindow returns the shortest run of units it finds that cannot
// be linearized from a lenient start (a free lock, a register of any
// value): first the shortest failing prefix, then the shortest failing
// suffix of that. Runs are cut anywhere if anyCut, else only at
// real-time cuts (see the file's comment). If even the whole history
// passes from the lenient start (it needs the register to start at 0),
// the whole history is the window.
func smallestWindow(units [][]op, anyCut bool, b budget) []op {
	fails := func(a, z int) bool {
		v := linearize(sortedOps(slices.Concat(units[a:z]...)), state{}, b)
		return !v.ok && !v.gaveUp
	}
	var cuts []int // where a window may begin or end
	latest := int64(math.MinInt64)
	for i, u := range units {
		if anyCut || latest < u[0].invoke {
			cuts = append(cuts, i)
		}
		for _, x := range u {
			latest = max(latest, x.response)
		}
	}
	cuts = append(cuts, len(units))
	if !fails(0, len(units)) {
		return slices.Concat(units...)
	}
	// Failing is monotone in both ends: a run that fails still fails with
	// more units at either end.
	z := cuts[sort.Search(len(cuts), func(i int) bool { return fails(0, cuts[i]) })]
	starts := slices.DeleteFunc(slices.Clone(cuts), func(c int) bool { return c >= z })
	a := starts[sort.Search(len(starts), func(i int) bool { return !fails(starts[i], z) })-1]
	return sortedOps(slices.Concat(units[a:z]...))
}

// sortedOps returns ops in invoke order (then response order).
func sortedOps(ops []op) []op {
	s := slices.Clone(ops)
	slices.SortStableFunc(s, func(x, y op) int {
		return cmp.Or(cmp.Compare(x.invoke, y.invoke), cmp.Compare(x.response, y.response))
	})
	return s
}

// describe lists a window's operations, at most limit of them.
func describe(window []op, limit int) string {
	var b strings.Builder
	for i, x := range window {
		if i == limit {
			fmt.Fprintf(&b, "\n\t… and %d more", len(window)-limit)
			break
		}
		fmt.Fprintf(&b, "\n\t%v", x)
	}
	return b.String()
}

// Hand-made operations, in ticks.
func grantOp(call int, invoke, response, token int64) op {
	return op{kind: opGrant, call: call, invoke: invoke, response: response, token: token}
}

func releaseOp(call int, invoke, response int64) op {
	return op{kind: opRelease, call: call, invoke: invoke, response: response}
}

func lossOp(call int, earliest, told int64) op {
	return op{kind: opLoss, call: call, invoke: earliest, response: told}
}

func admitOp(invoke, response, token int64) op {
	return op{kind: opAdmit, invoke: invoke, response: response, token: token}
}

func staleOp(invoke, response, token, highest int64) op {
	return op{kind: opStale, invoke: invoke, response: response, token: token, highest: highest}
}

func maybeOp(invoke, response, token int64) op {
	return op{kind: opMaybe, invoke: invoke, response: response, token: token}
}

// testBudget is ample for hand-made histories.
var testBudget = budget{nodes: 100_000, time: 10 * time.Second}

func TestLinearizabilityCheckerJudgesHandMadeHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fence bool
		ops   []op
		want  bool
	}{
		{"one holder after another passes", false, []op{
			grantOp(1, 0, 1, 1), releaseOp(1, 2, 3),
			grantOp(2, 1, 4, 2), releaseOp(2, 5, 6),
			grantOp(3, 6, 7, 3), lossOp(3, 8, 9),
			grantOp(4, 7, 10, 4), releaseOp(4, 11, 12),
		}, true},
		{"two overlapping holders, no loss, fail", false, []op{
			grantOp(1, 0, 1, 0), releaseOp(1, 10, 11),
			grantOp(2, 5, 6, 0), releaseOp(2, 7, 8),
		}, false},
		{"a grant while the holder's loss was not yet possible fails", false, []op{
			grantOp(1, 0, 1, 0), lossOp(1, 8, 9),
			grantOp(2, 5, 6, 0), releaseOp(2, 10, 11),
		}, false},
		{"a grant once the holder's loss was possible passes", false, []op{
			grantOp(1, 0, 1, 0), lossOp(1, 4, 9),
			grantOp(2, 2, 6, 0), releaseOp(2, 10, 11),
		}, true},
		{"a release frees only its own hold", false, []op{
			grantOp(1, 0, 1, 0), releaseOp(1, 20, 21),
			grantOp(2, 1, 10, 0), releaseOp(2, 2, 12),
		}, false},
		{"a token reused by two grants fails", false, []op{
			grantOp(1, 0, 1, 7), releaseOp(1, 2, 3),
			grantOp(2, 4, 5, 7), releaseOp(2, 6, 7),
		}, false},
		{"a token lower than an earlier grant's fails", false, []op{
			grantOp(1, 0, 1, 8), releaseOp(1, 2, 3),
			grantOp(2, 4, 5, 7), releaseOp(2, 6, 7),
		}, false},
		{"concurrent acquires granted in an order that fits pass", false, []op{
			// 2 and 3 wait together; 3 is granted first although 2 asked
			// first, and 1's release overlaps both grants.
			grantOp(1, 0, 1, 1), releaseOp(1, 2, 20),
			grantOp(2, 3, 40, 3), releaseOp(2, 41, 42),
			grantOp(3, 4, 30, 2), releaseOp(3, 31, 32),
		}, true},
		{"concurrent acquires whose tokens fit no order fail", false, []op{
			// 3 holds from before 2's grant could be placed to after it,
			// and has the higher token: 2 cannot come first, nor after.
			grantOp(1, 0, 1, 1), releaseOp(1, 2, 20),
			grantOp(2, 3, 40, 2), releaseOp(2, 41, 42),
			grantOp(3, 4, 30, 3), releaseOp(3, 35, 50),
		}, false},
		{"admitted writes in token order and a refusal pass", true, []op{
			admitOp(0, 1, 1), admitOp(2, 3, 1), admitOp(4, 5, 2), staleOp(6, 7, 1, 2), admitOp(8, 9, 3),
		}, true},
		{"a stale write admitted after a newer one fails", true, []op{
			admitOp(0, 1, 5), admitOp(2, 3, 3),
		}, false},
		{"concurrent writes admitted out of invoke order pass", true, []op{
			admitOp(0, 10, 5), admitOp(1, 3, 3), staleOp(4, 6, 2, 3),
		}, true},
		{"a refusal by a register no write set fails", true, []op{
			admitOp(0, 1, 2), staleOp(2, 3, 1, 3),
		}, false},
		{"a refusal of a token not below the register fails", true, []op{
			admitOp(0, 1, 2), staleOp(2, 3, 2, 0),
		}, false},
		{"a refusal before any write fails", true, []op{
			staleOp(0, 1, 1, 0), admitOp(2, 3, 1),
		}, false},
		{"a refusal explained by a write of unknown outcome passes", true, []op{
			admitOp(0, 1, 2), maybeOp(2, never, 4), staleOp(5, 6, 3, 4),
		}, true},
		{"a write of unknown outcome may have had none", true, []op{
			admitOp(0, 1, 2), maybeOp(2, never, 4), admitOp(5, 6, 3),
		}, true},
		{"a write of unknown outcome below the register had none", true, []op{
			admitOp(0, 1, 2), maybeOp(2, never, 1),
		}, true},
		{"a write of unknown outcome cannot take effect after its bound", true, []op{
			// It must have taken effect to explain the refusal at 8, but
			// it is bounded by the admitted 5 (which then cannot be
			// followed by a refusal reading 4).
			admitOp(0, 1, 2), maybeOp(2, 4, 4), admitOp(3, 4, 5), staleOp(8, 9, 3, 4),
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := object{name: tc.name, fence: tc.fence, ops: tc.ops}.check(testBudget)
			if r.gaveUp {
				t.Fatalf("gave up after %d nodes", r.nodes)
			}
			if r.ok != tc.want {
				t.Fatalf("linearizable = %v, want %v; window:%s", r.ok, tc.want, describe(r.window, 20))
			}
		})
	}
}

// TestLinearizabilityCheckerPointsAtTheSmallestWindow buries one bad pair
// in a long good history: the window is that pair and no more.
func TestLinearizabilityCheckerPointsAtTheSmallestWindow(t *testing.T) {
	var locks, writes []op
	var tick int64
	token := int64(0)
	for call := 1; call <= 200; call++ {
		token++
		locks = append(locks, grantOp(call, tick, tick+2, token), releaseOp(call, tick+3, tick+5))
		writes = append(writes, admitOp(tick+2, tick+3, token))
		if call == 120 { // the next holder is granted while this one holds
			locks[len(locks)-1] = releaseOp(call, tick+30, tick+31)
			writes = append(writes, admitOp(tick+4, tick+5, token-5)) // and a stale write is admitted
		}
		tick += 10
	}
	lock := object{name: "lock", ops: locks}.check(testBudget)
	if lock.ok || lock.gaveUp {
		t.Fatalf("lock: linearizable %v, gave up %v; want a violation", lock.ok, lock.gaveUp)
	}
	calls := map[int]bool{}
	for _, x := range lock.window {
		calls[x.call] = true
	}
	if len(lock.window) != 4 || !calls[120] || !calls[121] {
		t.Errorf("lock window:%s\nwant calls 120 and 121 alone", describe(lock.window, 20))
	}
	fence := object{name: "fence", fence: true, ops: writes}.check(testBudget)
	if fence.ok || fence.gaveUp {
		t.Fatalf("fence: linearizable %v, gave up %v; want a violation", fence.ok, fence.gaveUp)
	}
	if len(fence.window) != 2 || fence.window[0].token != 120 || fence.window[1].token != 115 {
		t.Errorf("fence window:%s\nwant the write of 120 and the stale 115 alone", describe(fence.window, 20))
	}

	// A register's window is cut only where real time separates: the
	// refusal at 13 reads 7, admitted by a write invoked after it, so a
	// window that ends between them would fail for no fault of theirs
	// (the search for the end of the window tries that cut first).
	fence = object{name: "fence", fence: true, ops: []op{
		admitOp(0, 1, 1), admitOp(2, 3, 2),
		admitOp(11, 12, 5), staleOp(13, 20, 5, 7), admitOp(14, 15, 7),
		admitOp(30, 31, 9), admitOp(32, 33, 8),
	}}.check(testBudget)
	if fence.ok || len(fence.window) != 2 || fence.window[0].token != 9 || fence.window[1].token != 8 {
		t.Errorf("fence: linearizable %v, window:%s\nwant the writes of 9 and 8 alone", fence.ok, describe(fence.window, 20))
	}
}

// TestLinearizabilityCheckerGivesUpLoudly: a search that runs out of
// budget says so instead of passing or failing.
func TestLinearizabilityCheckerGivesUpLoudly(t *testing.T) {
	// Twelve writes of unknown outcome, all concurrent, then one that no
	// subset explains: every order of every subset is tried.
	var ops []op
	for i := range 12 {
		ops = append(ops, maybeOp(int64(i), never, int64(i+1)))
	}
	ops = append(ops, staleOp(100, 101, 1, 99))
	r := object{name: "fence", fence: true, ops: ops}.check(budget{nodes: 1000, time: time.Minute})
	if !r.gaveUp || r.ok {
		t.Fatalf("gave up %v, linearizable %v after %d nodes; want a search out of budget", r.gaveUp, r.ok, r.nodes)
	}
	if r := (object{name: "fence", fence: true, ops: ops}).check(budget{nodes: 1 << 20, time: time.Minute}); r.ok || r.gaveUp {
		t.Fatalf("with budget enough: linearizable %v, gave up %v; want not linearizable", r.ok, r.gaveUp)
	}
}
