package main

import (
	"fmt"
	"math"
	"strings"
)

// pgDrivers are the drivers of the PostgreSQL tables, with their labels.
var pgDrivers = []struct{ id, label string }{
	{"pq", "lib/pq"},
	{"pgx", "pgx (stdlib, cache_statement)"},
}

// opRow describes one uncontended PostgreSQL operation. cat chooses the
// best peer it is compared with: "session" (goose's session locker,
// golang-migrate) or "lease" (goose's table locker).
type opRow struct {
	op, label, cat string
}

var pgRows = []opRow{
	{"select1_pinned", "`SELECT 1`, pinned connection — **the unit**", ""},
	{"select1_pool", "`SELECT 1` with pool checkout", ""},
	{"raw_param", "raw try + unlock, key as `$1`, pinned (the floor a user writes)", "session"},
	{"raw_literal", "raw try + unlock, key as a literal, pinned (protocol floor)", "session"},
	{"raw_prepared", "raw try + unlock prepared once on a pinned connection, key as an argument (advisorylock's form on lib/pq)", "session"},
	{"raw_literal_shared", "raw shared try + unlock (`pg_try_advisory_lock_shared`), key as a literal, pinned", "session"},
	{"raw_pool", "raw: pool checkout, try + unlock as literals, back to the pool", "session"},
	{"raw_pool_bounded", "raw: the same, unlock on its own 5s-bounded context (what `Release` must do)", "session"},
	{"raw_pool_ask", "raw: the same, unlock in a goroutine abandoned at the bound (survives a network cut lib/pq does not notice)", "session"},
	{"raw_pool_ask_nowatch", "raw: as above, the statement's own context without Done (no database/sql or driver watcher): the floor with a dead-network bound", "session"},
	{"raw_pool_worker", "raw: as above, the unlock handed to one long-lived worker goroutine instead of a fresh one", "session"},
	{"raw_pool_watchdog", "raw: pool checkout, try, and the unlock on the caller's goroutine under a timer that would close the driver connection at the bound (what advisorylock does on lib/pq)", "session"},
	{"raw_pool_floor", "raw: as above, and the checkout in a goroutine abandoned at the pool-wait bound (lib/pq does not end a new connection's startup with its context): the floor with every dead-network bound lib/pq needs", "session"},
	{"trylock_release", "**advisorylock `TryLock` + `Release`** (pool checkout included)", "session"},
	{"tryrlock_release", "advisorylock shared `TryRLock` + `Release` (pool checkout included)", "session"},
	{"trylock_release_nokeepalive", "advisorylock `TryLock` + `Release`, `WithKeepAlive(0)`", "session"},
	{"trylock_release_noop", "advisorylock `TryLock` + `Release`, `WithObserver` of a no-op `Observer`", "session"},
	{"trylock_release_prom", "advisorylock `TryLock` + `Release`, observed by `advisorylockprom`", "session"},
	{"trylock_release_otel", "advisorylock `TryLock` + `Release`, observed by `advisorylockotel` (SDK, metrics)", "session"},
	{"trylock_release_otel_traced", "advisorylock `TryLock` + `Release`, observed by `advisorylockotel` in a trace (metrics and two spans)", "session"},
	{"trydo", "**advisorylock `TryDo`** (no-op fn)", "session"},
	{"trydo_minhold", "advisorylock `TryDo` with `WithMinHold` (records its window at the grant)", "session"},
	{"lock_release", "advisorylock `Lock` + `Release`, uncontended", "session"},
	{"goose_session", "peer: goose v3 session locker, lock + unlock (pinned)", "session"},
	{"migrate", "peer: golang-migrate postgres `Lock` + `Unlock` (pinned)", "session"},
	{"leaselock", "**advisorylock `LeaseLock` `TryLock` + `Release`**", "lease"},
	{"leaselock_minhold", "advisorylock `LeaseLock` `TryLock` + `Release` with `WithMinHold`", "lease"},
	{"lease_raw_param", "raw lease upsert + release, parameterized, release unbounded", "lease"},
	{"lease_raw_param_bounded", "raw lease, parameterized, release on its own 5s-bounded context as `Release` must (the floor)", "lease"},
	{"lease_raw_literal", "raw lease upsert + release, literals", "lease"},
	{"lease_raw_literal_async_release", "raw lease, literals, release with `synchronous_commit = off`", "lease"},
	{"goose_table", "peer: goose v3 table (lease-row) locker, `Lock` + `Unlock`", "lease"},
	{"semaphore_tryacquire", "advisorylock `Semaphore` (3 slots) `TryAcquire` + `Release`", "session"},
	{"semaphore_raw", "raw semaphore: the slots tried in one `CASE` + unlock that notifies, literals, pinned (its floor)", "session"},
}

var peersOf = map[string][]string{
	"session": {"goose_session", "migrate"},
	"lease":   {"goose_table"},
}

var sqliteRows = []struct{ op, label, floor string }{
	{"select1", "`SELECT 1` — **the unit**", ""},
	{"raw_lock", "raw lock row: upsert + delete (floor of `Lock`)", ""},
	{"lock", "**advisorylock `Lock`: `TryLock` + `Release`**", "raw_lock"},
	{"raw_lease", "raw lease row: upsert with generation + release", ""},
	{"raw_lease_tokens", "raw lease row, `LeaseLock`'s statements: upsert with its generation read from the token counter + release (floor of `LeaseLock`)", ""},
	{"leaselock", "**advisorylock `LeaseLock`: `TryLock` + `Release`**", "raw_lease_tokens"},
}

// handoffRows are the handoff benchmarks in the order shown; kind colours
// the chart.
var handoffRows = []struct{ lib, label, kind, wait string }{
	{"advisorylock", "advisorylock `Lock`", "ours", "server-side, 1s slices"},
	{"raw_literal", "raw `pg_advisory_lock(<literal>)` — **the floor**", "floor", "server-side, unbounded"},
	{"raw_blocking", "raw `pg_advisory_lock($1)`", "floor", "server-side, unbounded"},
	{"migrate", "golang-migrate `Lock`", "peer", "server-side, unbounded"},
	{"leaselock", "advisorylock `LeaseLock`", "ours", "in line; woken by the release's notification (pgx), or asleep on the server, by the handover (lib/pq)"},
	{"goose_table", "goose table locker", "peer", "polls every 20ms (±25%); default 5s"},
	{"goose_session", "goose session locker", "peer", "polls every 1s (its floor); default 5s"},
	{"sqlite_raw", "raw SQLite upsert, polled", "floor", "polls every 20ms"},
	{"sqlite_lock", "advisorylock `Lock` on SQLite", "ours", "polls every 20ms"},
	{"sqlite_leaselock", "advisorylock `LeaseLock` on SQLite", "ours", "polls every 20ms"},
}

var handoffPeers = []string{"migrate", "goose_table", "goose_session"}

var scalingModes = []struct{ id, label string }{
	{"select1", "`SELECT 1` through the pool"},
	{"distinct", "`TryLock`+`Release`, one name per goroutine"},
	{"one", "`Lock`+`Release`, all on one name"},
}

var scalingCells = []struct{ g, pool int }{{1, 8}, {8, 8}, {64, 8}, {64, 2}, {64, 32}}

type report struct {
	res      *results // the pinned phase (unpinned when nothing could be pinned)
	unp      *results // the unpinned phase of the gating groups; empty if none
	pinned   bool     // whether res is pinned
	m        machine
	gs       []group
	cmdline  string
	stat     string
	rawPath  string
	svg      string
	suiteErr error
	targets  []target
}

// target is one gate, checked on one driver: on the pinned figures, with
// the unpinned ones reported beside them.
type target struct {
	what, driver, measured, unpinned, limit string
	drv                                     string // the driver's id in benchmark names
	met                                     *bool  // nil when not measured
}

func newReport(phases map[string]*results, m machine, gs []group, cmdline, stat, rawPath, svg string, suiteErr error) *report {
	r := &report{res: phases[phasePinned], unp: phases[phaseUnpinned], pinned: true,
		m: m, gs: gs, cmdline: cmdline, stat: stat, rawPath: rawPath, svg: svg, suiteErr: suiteErr}
	if r.res.empty() {
		r.res, r.unp, r.pinned = r.unp, newResults(), false
	}
	r.targets = r.checkTargets()
	return r
}

// ns is the median iteration time of an uncontended benchmark (p50-ns),
// or its mean where it reports no median.
func (r *report) ns(name string) (float64, bool) {
	if v, ok := r.res.median(name, "p50-ns"); ok {
		return v, true
	}
	return r.res.median(name, "ns/op")
}

func pgName(op, drv string) string { return "BenchmarkPG/" + op + "/" + drv }

// unit is SELECT 1 on a pinned connection, on drv (lib/pq's for pqbin).
func (r *report) unit(drv string) (float64, bool) {
	if drv == "pqbin" {
		drv = "pq"
	}
	return r.ns(pgName("select1_pinned", drv))
}

// bestPeer returns the fastest peer of category cat on drv.
func (r *report) bestPeer(cat, drv string) (string, float64, bool) {
	if drv == "pqbin" {
		drv = "pq"
	}
	best, bestV, ok := "", math.Inf(1), false
	for _, p := range peersOf[cat] {
		if v, found := r.ns(pgName(p, drv)); found && v < bestV {
			best, bestV, ok = p, v, true
		}
	}
	return best, bestV, ok
}

// gate is one ratio the gates check, measured in both phases.
type gate struct {
	what, limit string
	atMost      bool    // the ratio must be at most limit (else at least)
	bound       float64 // the limit
}

func (g gate) met(x float64) bool {
	if g.atMost {
		return x <= g.bound
	}
	return x >= g.bound
}

const (
	tryGateWhat     = "uncontended `TryLock`+`Release` (pool checkout included) ≤ 1.25× the bare two statements (keys as literals) on a pinned connection"
	handoffGateWhat = "handoff p50 ≤ 1.25× the same handoff done with bare statements on two pinned connections"
)

var (
	tryGate     = gate{tryGateWhat, "1.25×", true, 1.25}
	handoffGate = gate{handoffGateWhat, "1.25×", true, 1.25}
	leaseHand   = gate{"`LeaseLock` handoff p50 ≤ 3× the session `Lock` handoff (both held 5 ms, paired)", "3×", true, 3}
	leaseGoose  = gate{"`LeaseLock` handoff p50 ≥ 20× faster than goose's table locker (polling every 20 ms)", "20×", false, 20}
	leaseGrowth = gate{"`LeaseLock` handoff p99 after a 200 ms wait ≤ 1.25× its p99 after a 50 ms wait (a handoff does not grow with the wait)", "1.25×", true, 1.25}
	leaseGate   = gate{"`LeaseLock` acquire+release ≥ 1.5× faster than goose's table locker", "1.5×", false, 1.5}
	sqliteLock  = gate{"SQLite: `TryLock`+`Release` ≤ 1.25× its bare statements (upsert + delete)", "1.25×", true, 1.25}
	sqliteLease = gate{"SQLite: `LeaseLock` `TryLock`+`Release` ≤ 1.25× its bare statements (the upsert with its read of the token counter, the release)", "1.25×", true, 1.25}
	sqliteHand  = gate{"SQLite: handoff p50 ≤ 1.25× the bare upsert polled as often", "1.25×", true, 1.25}
	sqliteTail  = gate{"SQLite under contention: `Lock`+`Release` p99 ≤ 20× its p50 (32 goroutines over 256 names, one file)", "20×", true, 20}
	mysqlTry    = gate{"MySQL/MariaDB: `TryLock`+`Release` ≤ 1.25× its bare statements (`GET_LOCK` with its read of shared holders, `RELEASE_LOCK`; literal names, pinned connection)", "1.25×", true, 1.25}
	missCost    = gate{"a missed `TryLock` with 10,000 advisory locks held ≤ 1.5× one with 100 held (p50, alternating rounds; `MissCost`)", "1.5×", true, 1.5}
	peerThrough = gate{"throughput of 32 goroutines over 256 names (blocking `Lock`, `Release`) ≥ redislock's in the same run (`Peers/throughput`)", "1×", false, 1}
	muxThrough  = gate{"multiplexed throughput ≥ pinned, same driver, same run (`Peers/throughput`)", "1×", false, 1}
	muxHandoff  = gate{"multiplexed handoff p50 ≤ 1.25× pinned, same driver, same run (`Peers/handoff`)", "1.25×", true, 1.25}
	muxTail     = gate{"multiplexed handoff p99 ≤ 5× its p50 (`Peers/handoff`)", "5×", true, 5}
	mysqlHand   = gate{"MySQL/MariaDB: handoff p50 ≤ 1.25× the bare handoff (`GET_LOCK` with its read of shared holders, `RELEASE_LOCK`) on two pinned connections", "1.25×", true, 1.25}
)

// checkTargets checks every performance gate on the pinned, paired
// ratios; the unpinned ones are reported.
func (r *report) checkTargets() []target {
	var ts []target
	paired := func(g gate, driver, name string) {
		t := r.pairedTarget(g, driver, name, "x-base")
		t.drv = name[strings.LastIndexByte(name, '/')+1:]
		ts = append(ts, t)
	}
	for _, d := range pgDrivers {
		paired(tryGate, d.label, "BenchmarkPaired/trylock_release_vs_raw_literal/"+d.id)
	}
	for _, d := range pgDrivers {
		paired(handoffGate, d.label, "BenchmarkHandoffPaired/advisorylock_vs_raw_literal/"+d.id)
	}
	for _, d := range pgDrivers {
		ours, ok := r.res.median("BenchmarkHandoff/advisorylock/"+d.id, "p50-us")
		slowest, peer := math.Inf(1), ""
		for _, p := range []string{"goose_table", "goose_session"} {
			if v, found := r.res.median("BenchmarkHandoff/"+p+"/"+d.id, "p50-us"); found && v < slowest {
				slowest, peer = v, p
			}
		}
		t := target{what: "handoff p50 ≥ 20× faster than every polling peer", driver: d.label, limit: "20×", unpinned: "–", measured: "not measured"}
		if ok && peer != "" {
			met := slowest/ours >= 20
			t.met, t.measured = &met, fmt.Sprintf("%s faster than %s", ratio(slowest/ours), peer)
		}
		ts = append(ts, t)
	}
	for _, d := range pgDrivers {
		paired(leaseHand, d.label, "BenchmarkLeaseHandoffPaired/leaselock_vs_advisorylock/"+d.id)
	}
	paired(leaseHand, "lib/pq wrapped by advisorylockpq", "BenchmarkLeaseHandoffPaired/leaselock_pqlistener_vs_advisorylock/pq")
	for _, d := range pgDrivers {
		ts = append(ts, r.sequentialTarget(leaseGoose, d.label, "p50-us", "BenchmarkHandoff/goose_table/"+d.id, "BenchmarkHandoff/leaselock/"+d.id))
	}
	for _, d := range pgDrivers {
		ts = append(ts, r.sequentialTarget(leaseGrowth, d.label, "p99-us", "BenchmarkHandoff/leaselock_held200ms/"+d.id, "BenchmarkHandoff/leaselock_held50ms/"+d.id))
	}
	for _, d := range pgDrivers {
		paired(leaseGate, d.label, "BenchmarkPaired/goose_table_vs_leaselock/"+d.id)
	}
	paired(sqliteLock, "sqlite", "BenchmarkPaired/lock_vs_raw_lock/sqlite")
	paired(sqliteLease, "sqlite", "BenchmarkPaired/leaselock_vs_raw_lease_tokens/sqlite")
	ts = append(ts, r.sequentialTarget(sqliteHand, "sqlite", "p50-us", "BenchmarkHandoff/sqlite_lock/sqlite", "BenchmarkHandoff/sqlite_raw/sqlite"))
	ts = append(ts, r.pairedTarget(sqliteTail, "sqlite (`SQLiteContention`)", "BenchmarkSQLiteContention", "p99-x-p50"))
	ts = append(ts, r.mysqlTargets()...)
	for _, d := range pgDrivers {
		ts = append(ts, r.pairedTarget(missCost, d.label, "BenchmarkMissCost/"+d.id, "x-few"))
	}
	ts = append(ts, r.peerTargets()...)
	return ts
}

// peerTargets checks SPEC 11.3's per-entity gates on BenchmarkPeers:
// throughput against redislock's, pinned and multiplexed, and multiplexed
// against pinned (throughput, handoff p50 and its tail), per driver.
func (r *report) peerTargets() []target {
	var ts []target
	ratioOf := func(res *results, bench, num, den string) (float64, bool) {
		n, nok := res.median("BenchmarkPeers/"+bench, num)
		d, dok := res.median("BenchmarkPeers/"+bench, den)
		return n / d, nok && dok && d > 0
	}
	check := func(g gate, drv, driver, bench, num, den string) {
		t := target{what: g.what, drv: drv, driver: driver, limit: g.limit, measured: "not measured", unpinned: "–"}
		if x, ok := ratioOf(r.res, bench, num, den); ok {
			met := g.met(x)
			t.met, t.measured = &met, fine(x, g.bound)
		}
		if x, ok := ratioOf(r.unp, bench, num, den); ok {
			t.unpinned = fine(x, g.bound)
			if !g.met(x) {
				t.unpinned += " (over)"
			}
		}
		ts = append(ts, t)
	}
	for _, d := range pgDrivers {
		id := d.id
		for _, mode := range []string{"pinned", "mux"} {
			check(peerThrough, id+"-"+mode, d.label+" "+mode, "throughput", id+"-"+mode+"-ops/s", "redislock-ops/s")
		}
		check(muxThrough, id, d.label, "throughput", id+"-mux-ops/s", id+"-pinned-ops/s")
		check(muxHandoff, id, d.label, "handoff", id+"-mux-p50-us", id+"-pinned-p50-us")
		check(muxTail, id, d.label, "handoff", id+"-mux-p99-us", id+"-mux-p50-us")
	}
	return ts
}

// pairedTarget checks g on the median of name's unit in the pinned phase
// and reports it in the unpinned phase.
func (r *report) pairedTarget(g gate, driver, name, unit string) target {
	t := target{what: g.what, driver: driver, limit: g.limit, measured: "not measured", unpinned: "–"}
	if v, ok := r.res.median(name, unit); ok {
		met := g.met(v)
		t.met, t.measured = &met, fine(v, g.bound)+r.res.spread(name, unit)
	}
	if v, ok := r.unp.median(name, unit); ok {
		t.unpinned = fine(v, g.bound)
		if !g.met(v) {
			t.unpinned += " (over)"
		}
	}
	return t
}

// sequentialTarget checks g on the ratio of the medians of unit of two
// BenchmarkHandoff rows, num over den, measured one after the other (a
// polled handoff is too slow to pair iteration by iteration).
func (r *report) sequentialTarget(g gate, driver, unit, num, den string) target {
	t := target{what: g.what, driver: driver, limit: g.limit, measured: "not measured", unpinned: "–"}
	t.drv = num[strings.LastIndexByte(num, '/')+1:]
	n, nok := r.res.median(num, unit)
	d, dok := r.res.median(den, unit)
	if nok && dok {
		met := g.met(n / d)
		t.met, t.measured = &met, fine(n/d, g.bound)+" sequential"
	}
	return t
}

// mysqlTargets checks the MySQL/MariaDB gates on paired results (x-base):
// TryLock+Release against its own bare statements, the grab with its read
// of shared holders (see mysqlBareWhy), and the handoff against the bare
// handoff.
func (r *report) mysqlTargets() []target {
	return []target{
		r.pairedTarget(mysqlTry, "mysql (`MySQLPaired/trylock_release_vs_raw_shared_read`)", "BenchmarkMySQLPaired/trylock_release_vs_raw_shared_read", "x-base"),
		r.pairedTarget(mysqlHand, "mysql (`MySQLHandoffPaired/advisorylock_vs_raw_blocking_shared_read`)", "BenchmarkMySQLHandoffPaired/advisorylock_vs_raw_blocking_shared_read", "x-base"),
	}
}

// fine formats a ratio checked against limit, with a third decimal when
// two would round it onto the limit.
func fine(x, limit float64) string {
	if math.Abs(x-limit) < 0.005 {
		return fmt.Sprintf("%.3f×", x)
	}
	return ratio(x)
}

// targetSummary is a one-line-per-target summary for the terminal.
func (r *report) targetSummary() string {
	var b strings.Builder
	for _, t := range r.targets {
		fmt.Fprintf(&b, "%s %s [%s]: %s (unpinned %s)\n", mark(t.met), stripMD(t.what), t.driver, t.measured, t.unpinned)
	}
	return b.String()
}

func stripMD(s string) string { return strings.NewReplacer("`", "", "**", "").Replace(s) }

func mark(met *bool) string {
	switch {
	case met == nil:
		return "–"
	case *met:
		return "✓"
	default:
		return "✗"
	}
}

// handMarker starts the part of README.md that is written by hand (figures
// measured outside this suite's run); markdown keeps it as it is.
const handMarker = "<!-- Sections below are written by hand: cmd/report keeps them as they are. -->"

// markdown is README.md: the gates, the handoff against the peers, the
// machine and how the run was made, then hand, the hand-written part of
// the README it replaces (from handMarker on; "" for none). The other
// tables go to details.md (see detailsMarkdown), the raw output stays in
// rawPath.
func (r *report) markdown(details, hand string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# advisorylock benchmarks\n\n")
	w("Generated by `%s` (in `benchmarks/`) on %s; the sections after the hand-written marker at the end are kept as they were written.\n", r.cmdline, r.m.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("Every table of the run: [`%s`](%s). Raw output: [`%s`](%s) (`go tool benchstat %s` summarizes it); the benchmarks are the `_test.go` files of this directory.\n\n", details, details, r.rawPath, r.rawPath, r.rawPath)
	if r.suiteErr != nil {
		w("> **Some benchmarks failed in this run:** %s. Their rows are missing below.\n\n", r.suiteErr)
	}
	r.writeMethod(w)
	r.writeTargets(w)
	r.writeHandoffPaired(w)
	r.writeHandoff(w)
	r.writePeers(w)
	r.writeMachine(w)
	r.writeHow(w)
	if hand == "" {
		hand = handMarker + "\n"
	}
	w("%s", hand)
	return b.String()
}

// writeMethod says how to read the figures.
func (r *report) writeMethod(w func(string, ...any)) {
	w("Every figure is the median of its runs in this one run, against one server. ")
	w("The machine is shared and noisy, so compare **ratios within the run**, not absolute times across runs. ")
	w("Where it can, the report pins PostgreSQL (and MariaDB, when it runs on this machine) to CPU 0 and the benchmarks to the other CPUs (see \"CPU pinning\" below): ")
	w("every round trip then crosses CPUs, as it would to a database on another host, instead of sometimes sharing one CPU and taking a sixth of the time, which made ratios swing between runs. ")
	w("The unit is `SELECT 1` on a pinned connection with the same driver: one round trip. ")
	w("\"× best peer\" divides by the fastest peer doing the same job on the same driver ")
	w("(session locks: goose v3's session locker and golang-migrate's postgres driver; leases: goose v3's table locker); below 1 is faster than the peer.\n\n")
}

// detailsMarkdown is details.md: every other table of the run.
func (r *report) detailsMarkdown(readme string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# advisorylock benchmarks: every table\n\n")
	w("Generated by `%s` (in `benchmarks/`) on %s; do not edit by hand. ", r.cmdline, r.m.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("The gates, the machine and the commands are in [`%s`](%s); the raw output is [`%s`](%s).\n\n", readme, readme, r.rawPath, r.rawPath)
	r.writeMethod(w)
	r.writePaired(w)
	for _, d := range []struct{ id, label string }{{"pq", "lib/pq"}, {"pgx", "pgx (stdlib, default exec mode cache_statement)"}} {
		r.writeOps(w, d.id, d.label)
	}
	r.writeSQLite(w)
	r.writeMySQL(w)
	r.writeObserver(w)
	r.writeScaling(w)
	r.writeOther(w)
	return b.String()
}

func (r *report) writeTargets(w func(string, ...any)) {
	w("## Gates\n\n")
	if r.pinned {
		w("Verdicts use the **pinned, paired** ratios (see \"Paired ratios\" in details.md and \"Handoff, paired\" below): two operations alternate iteration by iteration, so load that comes and goes hits both alike. ")
		w("The same pairs run again with nothing pinned, right after the pinned run of their group; those figures are reported beside the verdict, not gated (\"(over)\" marks one above the limit). ")
		w("Unpinned, a round trip takes about a sixth of the time when the client and the server session share a CPU, and each server session stays where the scheduler put it, ")
		w("so a ratio between two operations on different sessions (the gate's bare statements run on a connection of their own) swings from about 0.5× to 1.5× between runs on this shared machine; ")
		w("pairs on the same pooled session (`raw_pool`, `raw_pool_bounded`, `raw_pool_ask*` in details.md) are the steadier unpinned figures. ")
	} else {
		w("**Nothing could be pinned in this run** (see \"CPU pinning\" below): the verdicts use unpinned paired ratios. ")
	}
	w("Allocations are reported in details.md, not gated; `SELECT 1` is shown as context.\n\n")
	first := "pinned"
	if !r.pinned {
		first = "measured (not pinned)"
	}
	w("| | gate | driver | %s | unpinned | limit |\n|---|---|---|---|---|---|\n", first)
	for _, t := range r.targets {
		w("| %s | %s | %s | %s | %s | %s |\n", mark(t.met), t.what, t.driver, t.measured, t.unpinned, t.limit)
	}
	w("\n")
	written := 0
	for _, t := range r.targets {
		if t.met == nil || *t.met {
			continue
		}
		if why := r.missWhy(t.what, t.drv); why != "" {
			if written == 0 {
				w("### Misses, and why\n\n")
			}
			written++
			w("- **%s**, %s: %s\n", t.what, t.driver, why)
		}
	}
	if written > 0 {
		w("\n")
	}
	if _, ok := r.res.median("BenchmarkMySQLPaired/trylock_release_vs_raw_shared_read", "x-base"); ok {
		w("### MySQL's bare statements\n\n%s\n\n", r.mysqlBareWhy())
	}
}

// missWhy explains a gate missed on driver drv, from what the
// decomposition rows of the paired table showed; "" where there is
// nothing known to say.
func (r *report) missWhy(what, drv string) string {
	pair := func(op, base string) string {
		return r.pairedRatio("BenchmarkPaired/" + op + "_vs_" + base + "/" + drv)
	}
	switch what {
	case tryGateWhat:
		if drv == "pgx" {
			return "pgx ends a statement when its context ends (it closes the socket), so the library runs no goroutine of its own for the bound; on top of the bare statements `TryLock`+`Release` checks a connection out of the pool and back (" + pair("raw_pool", "raw_literal") +
				"), gives the release a bounded context, which pgx watches (" + pair("raw_pool_bounded", "raw_pool") + "), and adds its own code to that (" + pair("trylock_release", "raw_pool_bounded") +
				"). For scale, a hop between goroutines, which this path makes nowhere on pgx, costs " + pair("raw_pool_ask_nowatch", "raw_pool") + " on this machine."
		}
		return "on top of the bare statements, `TryLock`+`Release` checks a connection out of the pool and back (" + pair("raw_pool", "raw_literal") + ") and bounds both by a dead network, which lib/pq does not notice when a context ends (lib/pq#620). " +
			"The release's bound is a timer that closes the connection under a statement still unanswered at the bound (" + pair("raw_pool_watchdog", "raw_pool") + "; the goroutine per release it replaced cost " + pair("raw_pool_ask_nowatch", "raw_pool") + "). " +
			"The checkout's bound is a goroutine the caller stops waiting for at the pool wait, since database/sql may open a new connection there and lib/pq's startup ignores the context: that hop costs " + pair("raw_pool_floor", "raw_pool_watchdog") +
			" (a long-lived worker instead measured " + pair("raw_pool_worker", "raw_pool_ask_nowatch") + " of a fresh goroutine). So lib/pq's floor with every bound is " + pair("raw_pool_floor", "raw_literal") +
			" the bare statements before any library code; the library adds " + pair("trylock_release", "raw_pool_floor") + " to it."
	case handoffGateWhat:
		return "the waiter's statement runs on the caller's goroutine under a timer that closes its connection should a dead network leave it unanswered; lib/pq watches its context in a goroutine of its own (a cancelled wait must leave the server's lock queue at once, so the wait keeps its context) " +
			"and database/sql watches the row's context in another: the grant reaches the caller through hops the bare statement does not make (see the `TryLock`+`Release` gate)."
	case sqliteLock.what:
		return "the grant is the bare upsert's statement (shared holders keep a summary row it refuses, SQLite schema step 4); what remains is the library's own work around two statements that each commit a write transaction bound by the disk's sync on a shared machine: " +
			"measured with `synchronous=OFF` (CPU alone), `TryLock`+`Release` was 1.30–1.33× the bare pair's ~100 µs (before the driver stopped getting contexts that can end, which cost a goroutine per statement)."
	case mysqlTry.what:
		pair := func(op, base string) string { return r.pairedRatio("BenchmarkMySQLPaired/" + op + "_vs_" + base) }
		return "on top of its bare statements, `TryLock`+`Release` checks a connection out of the pool and back and gives the release a bounded context, which go-sql-driver watches in a goroutine of its own (" +
			pair("raw_pool_bounded", "raw_pool") + " the bare statements through the pool); with the read and the library's own code, `TryLock`+`Release` is " + pair("trylock_release", "raw_pool_bounded") + " that."
	case sqliteLease.what, sqliteHand.what:
		return "each statement commits a write transaction bound by the disk's sync on a shared machine, so the ratio moves with the disk; the library hands the driver no context that can end (that cost a goroutine per statement, 12% of the pair unpinned)."
	case leaseHand.what:
		if drv != "pgx" {
			return "lib/pq hands notifications only to a `pq.Listener`, a connection of its own that the library cannot open from a `*sql.DB`, so on a plain lib/pq handle the waiter next in line sleeps on the server, and the release that hands it the lease cancels the sleep from inside its statement, before it commits. The sleep catches the cancel and its message then reads the row, which waits for the release to commit: no round trip of the waiter's own after the release, but on the server's one CPU the sleeper's backend handles the cancel, runs the read, waits on the releasing transaction, and runs again once it has committed, where a session `Lock`'s waiter is woken once by the unlock. On a handle wrapped by extra/advisorylockpq a pq.Listener wakes it, as on pgx."
		}
		return "a woken lease handoff is a release that hands the lease to the waiter's place in line and notifies it, then the notification's hop to the waiter's listener; a session handoff is one unlock that wakes a waiter inside the server. " +
			"The same statements run bare on pgx's own connections (`raw_lease_vs_raw_literal`) measured " + r.pairedRatio("BenchmarkLeaseHandoffPaired/raw_lease_vs_raw_literal/pgx") + " the bare session handoff."
	case leaseGoose.what:
		if drv != "pgx" {
			return "on a plain lib/pq handle the waiter next in line sleeps on the server and the handover cancels the sleep; the sleep's message then reads the row once the release commits (see the handoff gate above); wrapped by extra/advisorylockpq it is woken, as on pgx."
		}
		return "goose's table locker runs here at a 20 ms poll (its default is 5 s), so its handoff is about half a poll, and 20× faster is a few hundred microseconds. A woken LeaseLock waiter waits in line in the lease's row, and its holder releases once the place is taken, as a session `Lock`'s releases once the waiters are in `pg_locks`; each release then wakes every contender's listener backend (one per `*sql.DB`) on the server's one CPU, and the waiter passed over queues for the next place, so the handoff costs about two session handoffs here (\"The lease handoff, handed over\" in findings.md)."
	case leaseGrowth.what:
		if drv != "pgx" {
			return "a plain lib/pq handle hears no releases: the waiter next in line sleeps on the server and is woken by the handover, but the one behind it polls, backing off from 20 ms to half a second so that a hundred waiting replicas do not send thousands of queries a second, and takes the place only at its next poll after the handover; the longer it has waited, the later that poll, and a release before it frees the lease to whoever polls first. Wrap the handle with extra/advisorylockpq and every waiter is woken, as on pgx."
		}
		return "the p99 of a run's handoffs is close to its slowest; a woken waiter does not back off, but a handoff whose notification came late is caught by the poll, which does."
	case peerThrough.what:
		return "a pinned lock holds a session of its own and costs it two round trips, the try and the unlock, as redislock's two commands cost it; " +
			"with the benchmark process on one CPU, the sockets' system calls take most of the client's time on either side, and a PostgreSQL statement costs the server more CPU than a Redis command. " +
			"The multiplexed rows (the default) answer many tries and releases in one statement. \"Where the pinned rows' time goes\" in findings.md has the measurements." +
			r.floorWhy(strings.TrimSuffix(drv, "-pinned"))
	case leaseGate.what:
		return "both are bound by the WAL flush of the acquire's commit; the release already commits without waiting for it."
	case muxTail.what:
		p50, ok1 := r.res.median("BenchmarkPeers/handoff", drv+"-pinned-p50-us")
		p99, ok2 := r.res.median("BenchmarkPeers/handoff", drv+"-pinned-p99-us")
		if !ok1 || !ok2 || p50 == 0 {
			return ""
		}
		return "in the timed window (the holder's release to the waiter's return) a multiplexed handoff runs what a pinned one does: the waiter missed on its shared session and waits on a connection of its own. " +
			"The pinned rows' p99 in the same passes was " + ratio(p99/p50) + " their p50 (the gate asks it of the multiplexed rows alone); a pass's p99 is the third slowest of its 300 handoffs, so the machine's pauses set it (\"The multiplexed handoff's p99\" in findings.md)."
	}
	return ""
}

// pairedRatio formats the median x-base of the paired result name, or
// "–" when it did not run.
func (r *report) pairedRatio(name string) string {
	v, ok := r.res.median(name, "x-base")
	if !ok {
		return "–"
	}
	return ratio(v)
}

// mysqlBareWhy says why MySQL's TryLock+Release gate is against the
// grab with its read of shared holders, and what that read costs, from the
// decomposition rows of BenchmarkMySQLPaired (see mysqlPairedRows).
func (r *report) mysqlBareWhy() string {
	pair := func(op, base string) string { return r.pairedRatio("BenchmarkMySQLPaired/" + op + "_vs_" + base) }
	unpinned := func(op, base string) string {
		if v, ok := r.unp.median("BenchmarkMySQLPaired/"+op+"_vs_"+base, "x-base"); ok {
			return ratio(v)
		}
		return "–"
	}
	ran := ""
	if pair("raw_shared_read", "raw_literal") == "–" {
		ran = " (not measured in this run: – below)"
	}
	return "MySQL has no shared named locks, so `RLock` keeps its holders as rows of `advisorylock_shared`, and an exclusive grant must exclude them. " +
		"A bare `GET_LOCK`/`RELEASE_LOCK` pair excludes no shared holder. The statements of an exclusive lock on MySQL are `GET_LOCK` followed, in the same statement, by a read of the name's live shared rows " +
		"(read first, and a shared holder can enter between the read and the grant), and `RELEASE_LOCK`. " +
		"The gate compares `TryLock`+`Release` with those two statements written by hand and run bare on a pinned connection (`raw_shared_read`), as SQLite's gate compares with its bare upsert, which refuses shared holders in the same statement. " +
		"The price of the read is reported here, not gated" + ran + ": the bare grab with its read costs " + pair("raw_shared_read", "raw_literal") + " the bare `GET_LOCK` pair (unpinned " + unpinned("raw_shared_read", "raw_literal") + "), " +
		"and `TryLock`+`Release` costs " + pair("trylock_release", "raw_literal") + " it (unpinned " + unpinned("trylock_release", "raw_literal") + "); the table below has the rest. " +
		"Why the read is the floor while shared holders are unbounded: a named lock has one holder and is freed without notice when its session ends, so no fixed set of names can show that none of any number of shared holders is in " +
		"(one name held for all of them would have to pass from holder to holder, and a holder that dies passes it to no one); capping the shared holders at a few names costs about 1% per name tested " +
		"(measured by hand, interleaved: 16 names 1.18×, 64 names 1.68× the bare statements) and would cap `RLock`. " +
		"The same statement testing one named lock instead of reading costs " + pair("raw_named_check", "raw_literal") + " (`raw_named_check`). " +
		"Other shapes of the read measured within noise of it: `COUNT(*)`, `LIMIT 1`, `FORCE INDEX`, `IN`, `eq_range_index_dive_limit=1`; a one-row-per-name summary table read by its primary key (a constant lookup the optimizer makes before it executes anything) 0.99× of the read; " +
		"an `ENGINE=MEMORY` table " + pair("raw_shared_read_memory", "raw_shared_read") + " (`raw_shared_read_memory`), and MySQL Group Replication and Percona XtraDB Cluster's strict mode refuse writes to tables not on InnoDB, so the table stays InnoDB. " +
		"What did measure cheaper is not the read but the text: the grab and the release as server-side prepared statements (placeholders, prepared once per connection) cost 1.02–1.13× the bare pair, by hand, pinned, against 1.17–1.29× for the text grab in the same runs (4 runs of 2,000 interleaved rounds each): " +
		"parsing and preparing the text statement is much of what the read costs. So the library runs its exclusive try and its unlock that way: prepared once per pooled connection (through `Conn.Raw`: database/sql prepares a `Stmt` per pool, not per pinned connection), prepared again after a session reset (`COM_RESET_CONNECTION` drops them), and sent as text where a proxy refuses to prepare; the gate above has the result. " +
		"The handoff gate is measured the same way: against `GET_LOCK` waiting with the same read, and `RELEASE_LOCK`, on two pinned connections (`raw_blocking_shared_read`; the table under \"MySQL / MariaDB\" also has the handoff against bare `GET_LOCK`). " +
		"What `Lock` adds to that handoff is mostly the driver's: `Lock` bounds each wait and `Release` its release by a context with a deadline (a dead network must not hold either), and go-sql-driver hands such a context to a goroutine of the connection and waits for it when the statement ends; the same bare statements so bounded (`raw_blocking_shared_read_bounded`) measure within a few percent of `Lock`, and that goroutine costs most when the server and the client share the CPUs (unpinned)."
}

func (r *report) writeMachine(w func(string, ...any)) {
	m := r.m
	w("## Machine and versions\n\n")
	w("- CPU: %s (%s); load average %s before the run, %s after\n", m.CPUModel, m.OS, m.LoadBefore, m.LoadAfter)
	w("- PostgreSQL: %s, over loopback TCP; %s\n", m.PGVersion, m.PGSettings)
	w("- CPU pinning: %s\n", m.Pinning)
	w("- SQLite: %s (github.com/glebarez/go-sqlite, pure Go), WAL, `busy_timeout(5000)`, files on the local disk\n", m.SQLite)
	w("- Go: %s; advisorylock at %s\n", m.GoVersion, m.Commit)
	w("- Modules:\n")
	for _, mod := range m.Modules {
		w("  - `%s`\n", mod)
	}
	w("- Run took %s\n\n", m.Took.Round(1e9))
}

func (r *report) writeOps(w func(string, ...any), drv, label string) {
	w("## Uncontended operations — %s\n\n", label)
	w("| operation | p50 | mean | × `SELECT 1` | × best peer | unpinned p50 | round trips | B/op | allocs/op |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range pgRows {
		drvs := []string{drv}
		if drv == "pq" && row.op == "raw_param" {
			drvs = append(drvs, "pqbin")
		}
		for _, d := range drvs {
			name := pgName(row.op, d)
			v, ok := r.ns(name)
			if !ok {
				continue
			}
			label := row.label
			if d == "pqbin" {
				label += ", `binary_parameters=yes`"
			}
			unit, uok := r.unit(d)
			peerCol := "–"
			if row.cat != "" {
				if p, pv, pok := r.bestPeer(row.cat, d); pok {
					peerCol = fmt.Sprintf("%s (%s)", ratio(v/pv), p)
				}
			}
			unitCol := "–"
			if uok {
				unitCol = ratio(v / unit)
			}
			mean, _ := r.res.median(name, "ns/op")
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", label, dur(v), dur(mean), unitCol, peerCol, r.unpinnedP50(name),
				r.num("BenchmarkRoundTrips/"+row.op+"/"+d, "rt/op", "%.1f"), r.num(name, "B/op", "%.0f"), r.num(name, "allocs/op", "%.0f"))
		}
	}
	w("\n")
}

// unpinnedP50 is name's median iteration in the unpinned phase, or "–".
func (r *report) unpinnedP50(name string) string {
	v, ok := r.unp.median(name, "p50-ns")
	if !ok {
		return "–"
	}
	return dur(v)
}

func (r *report) num(name, unit, format string) string {
	v, ok := r.res.median(name, unit)
	if !ok {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// pairedRows are the BenchmarkPaired results shown, in order.
var pairedRows = []struct{ op, base, label string }{
	{"trylock_release", "raw_literal", "**`TryLock`+`Release`** vs the bare statements (literal keys, pinned connection) — **the gate**"},
	{"trydo", "raw_literal", "`TryDo` vs the bare statements"},
	{"raw_pool_floor", "raw_literal", "the floor with every dead-network bound lib/pq needs (pool checkout in an abandonable goroutine, unlock under a timer that closes the connection) vs the bare statements"},
	{"raw_literal", "select1_pinned", "context: the bare statements vs `SELECT 1`"},
	{"raw_prepared", "raw_literal", "context: the bare statements prepared once vs sent as text (lib/pq's try and unlock are prepared per connection)"},
	{"raw_pool", "raw_literal", "cost of the pool checkout: `raw_pool` vs `raw_literal`"},
	{"raw_pool_bounded", "raw_pool", "cost of a bounded release context (lib/pq: its cancel watcher goroutine): `raw_pool_bounded` vs `raw_pool`"},
	{"raw_pool_ask", "raw_pool", "cost of an abandonable release goroutine, driver watching the context too: `raw_pool_ask` vs `raw_pool`"},
	{"raw_pool_ask_nowatch", "raw_pool", "cost of an abandonable release goroutine alone (the dead-network bound): `raw_pool_ask_nowatch` vs `raw_pool`"},
	{"raw_pool_worker", "raw_pool_ask_nowatch", "a long-lived worker goroutine instead of a fresh one: `raw_pool_worker` vs `raw_pool_ask_nowatch`"},
	{"trylock_release", "raw_pool_ask_nowatch", "`TryLock`+`Release` vs `raw_pool_ask_nowatch`"},
	{"raw_pool_watchdog", "raw_pool", "cost of a release bounded by a timer that closes the connection (lib/pq, advisorylock's way): `raw_pool_watchdog` vs `raw_pool`"},
	{"raw_pool_floor", "raw_pool_watchdog", "cost of a checkout in an abandonable goroutine (lib/pq's connection startup): `raw_pool_floor` vs `raw_pool_watchdog`"},
	{"trylock_release", "raw_pool_floor", "what the library adds to its hand-written floor: `TryLock`+`Release` vs `raw_pool_floor`"},
	{"trylock_release", "raw_pool", "`TryLock`+`Release` vs `raw_pool` (the same pooled server session: the steadier unpinned figure)"},
	{"trylock_release", "raw_pool_ask", "`TryLock`+`Release` vs `raw_pool_ask`"},
	{"trylock_release", "raw_pool_bounded", "`TryLock`+`Release` vs `raw_pool_bounded`"},
	{"trylock_release", "trylock_release_nokeepalive", "`TryLock`+`Release` vs the same with `WithKeepAlive(0)`"},
	{"raw_param", "select1_pinned", "context: raw try + unlock (`$1`, pinned) vs `SELECT 1`"},
	{"goose_session", "select1_pinned", "context: goose session locker vs `SELECT 1`"},
	{"trylock_release", "select1_pinned", "context: `TryLock`+`Release` vs `SELECT 1`"},
	{"trylock_release_nokeepalive", "select1_pinned", "context: `TryLock`+`Release`, `WithKeepAlive(0)`, vs `SELECT 1`"},
	{"trydo", "select1_pinned", "context: `TryDo` vs `SELECT 1`"},
	{"goose_table", "leaselock", "goose table locker vs **`LeaseLock`**"},
	{"trydo_minhold", "trydo", "`TryDo` with `WithMinHold` vs without"},
	{"leaselock_minhold", "leaselock", "`LeaseLock` with `WithMinHold` vs without"},
	{"semaphore_tryacquire", "semaphore_raw", "**`Semaphore` `TryAcquire`+`Release`** (3 slots) vs its bare statements (one `CASE` try over the slots + unlock that notifies, literal keys, pinned)"},
	{"semaphore_tryacquire", "trylock_release", "`Semaphore` `TryAcquire`+`Release` vs a `Lock`'s `TryLock`+`Release`"},
	{"semaphore_raw", "raw_literal", "context: the semaphore's bare statements vs a lock's"},
	{"tryrlock_release", "raw_literal_shared", "shared `TryRLock`+`Release` vs the bare shared statements (literal keys, pinned connection)"},
	{"tryrlock_release", "trylock_release", "shared `TryRLock`+`Release` vs exclusive `TryLock`+`Release`"},
}

func (r *report) writePaired(w func(string, ...any)) {
	w("## Paired ratios\n\n")
	w("Two operations alternate iteration by iteration on one handle (the order flips every iteration); the ratio is of their median iteration times, ")
	w("so load that comes and goes hits both alike. The gates above use these. The unpinned column is the same pair run right after with nothing pinned.\n\n")
	w("| pair | driver | op p50 | base p50 | ratio | unpinned ratio |\n|---|---|---:|---:|---:|---:|\n")
	for _, p := range pairedRows {
		for _, d := range pgDrivers {
			r.pairedRow(w, p.label, d.id, "BenchmarkPaired/"+p.op+"_vs_"+p.base+"/"+d.id, "ns")
		}
	}
	r.pairedRow(w, "SQLite `TryLock`+`Release` vs its bare statements", "sqlite", "BenchmarkPaired/lock_vs_raw_lock/sqlite", "ns")
	r.pairedRow(w, "SQLite `LeaseLock` vs its bare statements (with the token counter's read)", "sqlite", "BenchmarkPaired/leaselock_vs_raw_lease_tokens/sqlite", "ns")
	r.pairedRow(w, "SQLite bare lease statements with the token counter's read vs without: what tokens that never go down cost (reported, not gated)", "sqlite", "BenchmarkPaired/raw_lease_tokens_vs_raw_lease/sqlite", "ns")
	r.pairedRow(w, "SQLite `LeaseLock` vs the bare lease statements without the token counter (reported, not gated)", "sqlite", "BenchmarkPaired/leaselock_vs_raw_lease/sqlite", "ns")
	w("\n")
}

// pairedRow writes one row of a paired table; scale is the unit of the
// p50 metrics ("ns" or "us").
func (r *report) pairedRow(w func(string, ...any), label, drv, name, scale string) {
	x, ok := r.res.median(name, "x-base")
	ux, uok := r.unp.median(name, "x-base")
	if !ok && !uok {
		return
	}
	mul := 1.0
	if scale == "us" {
		mul = 1e3
	}
	op, _ := r.res.median(name, "op-p50-"+scale)
	base, _ := r.res.median(name, "base-p50-"+scale)
	xs, uxs := "–", "–"
	if ok {
		xs = ratio(x)
	}
	if uok {
		uxs = ratio(ux)
	}
	w("| %s | %s | %s | %s | %s | %s |\n", label, drv, dur(op*mul), dur(base*mul), xs, uxs)
}

// writeHandoffPaired shows the handoff gate's pairs.
func (r *report) writeHandoffPaired(w func(string, ...any)) {
	w("## Handoff, paired with the bare handoff\n\n")
	w("Two contenders per library take turns on one name, each on a connection of its own: the holder releases once the other waits in the server (`pg_locks`), ")
	w("and the time runs from the release call to the waiter's return from its acquire. A handoff of advisorylock's `Lock` and one of the bare statements ")
	w("(`pg_advisory_lock`/`pg_advisory_unlock` with the key as a literal, on two pinned connections) alternate, in alternating order; the ratio is of their medians.\n\n")
	w("| pair | driver | op p50 | base p50 | ratio | unpinned ratio |\n|---|---|---:|---:|---:|---:|\n")
	for _, d := range pgDrivers {
		r.pairedRow(w, "advisorylock `Lock` vs the bare handoff", d.id, "BenchmarkHandoffPaired/advisorylock_vs_raw_literal/"+d.id, "us")
	}
	w("\n")
}

// observerOps are the per-op rows of TryLock+Release with an Observer
// (benchmarks/observer_test.go), when the run has them.
var observerOps = []struct{ op, label string }{
	{"trylock_release_noop", "cost of the observer's call sites: no-op `Observer` vs none"},
	{"trylock_release_prom", "observed by Prometheus vs not observed"},
	{"trylock_release_otel", "observed by OpenTelemetry (metrics) vs not observed"},
	{"trylock_release_otel_traced", "observed by OpenTelemetry in a trace vs not observed"},
}

// writeObserver shows what an Observer costs: TryLock+Release with each
// observer paired with none, and each event sequence without a database,
// set against TryLock+Release.
func (r *report) writeObserver(w func(string, ...any)) {
	events := r.res.matching("benchmarkobserverevents/")
	found := len(events) > 0
	for _, o := range observerOps {
		for _, d := range pgDrivers {
			if len(r.res.vals["BenchmarkPaired/"+o.op+"_vs_trylock_release/"+d.id]) > 0 || len(r.res.vals[pgName(o.op, d.id)]) > 0 {
				found = true
			}
		}
	}
	if !found {
		w("## Observer\n\nNot measured in this run (no observer benchmarks).\n\n")
		return
	}
	w("## Observer\n\n")
	w("`TryLock`+`Release` with an Observer, paired with the same without one (allocations per op are in the per-op tables above):\n\n")
	w("| observer | driver | with p50 | without p50 | ratio | unpinned ratio |\n|---|---|---:|---:|---:|---:|\n")
	for _, o := range observerOps {
		for _, d := range pgDrivers {
			r.pairedRow(w, o.label, d.id, "BenchmarkPaired/"+o.op+"_vs_trylock_release/"+d.id, "ns")
		}
	}
	w("\nThe observer's own cost per event sequence, without a database, and as a share of a pinned `TryLock`+`Release` (p50):\n\n")
	w("| event sequence / observer | ns/op | B/op | allocs/op | share of lib/pq `TryLock`+`Release` | share of pgx's |\n|---|---:|---:|---:|---:|---:|\n")
	pq, pqok := r.ns(pgName("trylock_release", "pq"))
	pgx, pgxok := r.ns(pgName("trylock_release", "pgx"))
	for _, name := range events {
		v, _ := r.res.median(name, "ns/op")
		share := func(base float64, ok bool) string {
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.2f%%", 100*v/base)
		}
		w("| `%s` | %s | %s | %s | %s | %s |\n", strings.TrimPrefix(name, "BenchmarkObserverEvents/"), dur(v),
			r.num(name, "B/op", "%.0f"), r.num(name, "allocs/op", "%.0f"), share(pq, pqok), share(pgx, pgxok))
	}
	w("\n")
}

// writeMySQL shows every benchmark whose name mentions MySQL (added by
// benchmarks/mysql_test.go), or says none ran.
func (r *report) writeMySQL(w func(string, ...any)) {
	w("## MySQL / MariaDB\n\n")
	names := r.res.matching("mysql")
	if len(names) == 0 {
		w("Not measured in this run (no benchmark names MySQL).\n\n")
		return
	}
	where := "the MySQL/MariaDB server was not pinned (see \"CPU pinning\" above)"
	if strings.Contains(r.m.Pinning, "MariaDB's threads") {
		where = "the MySQL/MariaDB server's threads on CPU 0, as PostgreSQL's processes"
	}
	w("From `benchmarks/mysql_test.go`, in the groups \"MySQL paired ratios\" (also unpinned) and \"other benchmarks\": the benchmarks ran on the client CPUs, %s. ", where)
	w("The gates above use `MySQLPaired/trylock_release_vs_raw_shared_read` and `MySQLHandoffPaired/advisorylock_vs_raw_blocking_shared_read` (see \"MySQL's bare statements\" under the gates).\n\n")
	r.writeMySQLPairs(w, "pair", "BenchmarkMySQLPaired", mysqlPairedRows, "ns")
	r.writeMySQLPairs(w, "handoff pair", "BenchmarkMySQLHandoffPaired", mysqlHandoffRows, "us")
	r.writeMetrics(w, names)
}

// mysqlPair is a paired MySQL result, op against base, as the report
// labels it.
type mysqlPair struct{ op, base, label string }

// mysqlPairedRows are the BenchmarkMySQLPaired results shown as the
// decomposition of the TryLock+Release gate, in order.
var mysqlPairedRows = []mysqlPair{
	{"trylock_release", "raw_shared_read", "**`TryLock`+`Release`** vs its bare statements (`GET_LOCK` with its read of shared holders, `RELEASE_LOCK`; literal names, pinned connection) — **the gate**"},
	{"raw_shared_read", "raw_literal", "the bare grab with its read vs bare `GET_LOCK`/`RELEASE_LOCK`: what excluding shared holders costs (reported, not gated)"},
	{"trylock_release", "raw_literal", "`TryLock`+`Release` vs bare `GET_LOCK`/`RELEASE_LOCK`, which exclude no shared holder (reported, not gated)"},
	{"trylock_release", "raw_pool_bounded", "`TryLock`+`Release` vs bare `GET_LOCK`/`RELEASE_LOCK` through the pool, the release on a bounded context"},
	{"raw_pool_bounded", "raw_pool", "the bare statements through the pool, the release on a bounded context, vs without the bound"},
	{"raw_named_check", "raw_literal", "the grab with one named-lock test (`IS_FREE_LOCK`) in place of its read, bare, vs bare `GET_LOCK`/`RELEASE_LOCK`"},
	{"raw_shared_read_memory", "raw_shared_read", "the same read of an `ENGINE=MEMORY` table vs the InnoDB one"},
}

// mysqlHandoffRows are the BenchmarkMySQLHandoffPaired results shown as
// the decomposition of the handoff gate, in order.
var mysqlHandoffRows = []mysqlPair{
	{"advisorylock", "raw_blocking_shared_read", "**`Lock`'s handoff** vs the bare handoff (`GET_LOCK` waiting with its read of shared holders, `RELEASE_LOCK`; two pinned connections) — **the gate**"},
	{"raw_blocking_shared_read", "raw_blocking", "the bare handoff with the read vs bare `GET_LOCK`/`RELEASE_LOCK`: what excluding shared holders costs (reported, not gated)"},
	{"advisorylock", "raw_blocking", "`Lock`'s handoff vs bare `GET_LOCK`/`RELEASE_LOCK`, which exclude no shared holder (reported, not gated)"},
	{"advisorylock", "raw_blocking_shared_read_bounded", "`Lock`'s handoff vs the bare handoff with the read, each statement bounded by a context with a deadline as `Lock` bounds its waits and `Release` its release (the driver watches such a context on a goroutine of the connection, which costs most on a loaded machine)"},
}

// writeMySQLPairs writes rows, the decomposition of a MySQL gate measured
// by bench (scale: the unit of its p50s, "ns" or "us"), if it ran.
func (r *report) writeMySQLPairs(w func(string, ...any), first, bench string, rows []mysqlPair, scale string) {
	if _, ok := r.res.median(bench+"/"+rows[0].op+"_vs_"+rows[0].base, "x-base"); !ok {
		return
	}
	w("| %s | driver | op p50 | base p50 | ratio | unpinned ratio |\n|---|---|---:|---:|---:|---:|\n", first)
	for _, p := range rows {
		r.pairedRow(w, p.label, "mysql", bench+"/"+p.op+"_vs_"+p.base, scale)
	}
	w("\n")
}

// writeOther shows every result no section above looked up, so that a
// new benchmark is never silently left out.
func (r *report) writeOther(w func(string, ...any)) {
	names := r.res.unseen()
	unp := r.unp.unseen()
	if len(names) == 0 && len(unp) == 0 {
		return
	}
	w("## Other benchmarks\n\nResults no section above shows, as measured (medians).\n\n")
	if len(names) > 0 {
		r.writeMetrics(w, names)
	}
	if len(unp) > 0 {
		w("Unpinned:\n\n")
		saved := r.res
		r.res = r.unp
		r.writeMetrics(w, unp)
		r.res = saved
	}
}

// writeMetrics writes one row per benchmark with every metric it reports.
func (r *report) writeMetrics(w func(string, ...any), names []string) {
	w("| benchmark | metrics (median) |\n|---|---|\n")
	for _, name := range names {
		var parts []string
		for _, u := range r.res.units(name) {
			v, _ := r.res.median(name, u)
			switch u {
			case "ns/op", "p50-ns", "base-p50-ns", "op-p50-ns":
				parts = append(parts, u+" "+dur(v))
			default:
				parts = append(parts, fmt.Sprintf("%s %.4g", u, v))
			}
		}
		w("| `%s` | %s |\n", strings.TrimPrefix(name, "Benchmark"), strings.Join(parts, "; "))
	}
	w("\n")
}

func (r *report) writeSQLite(w func(string, ...any)) {
	w("## Uncontended operations — SQLite\n\n")
	w("| operation | p50 | mean | × `SELECT 1` | × raw floor | unpinned p50 | B/op | allocs/op |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	unit, uok := r.ns("BenchmarkSQLite/select1")
	for _, row := range sqliteRows {
		name := "BenchmarkSQLite/" + row.op
		v, ok := r.ns(name)
		if !ok {
			continue
		}
		unitCol, floorCol := "–", "–"
		if uok {
			unitCol = ratio(v / unit)
		}
		if f, fok := r.ns("BenchmarkSQLite/" + row.floor); row.floor != "" && fok {
			floorCol = ratio(v / f)
		}
		mean, _ := r.res.median(name, "ns/op")
		w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.label, dur(v), dur(mean), unitCol, floorCol, r.unpinnedP50(name), r.num(name, "B/op", "%.0f"), r.num(name, "allocs/op", "%.0f"))
	}
	w("\nEach acquire and release commits a write transaction, so these are bound by the disk's sync, not by SQL.\n\n")
}

func (r *report) writeHandoff(w func(string, ...any)) {
	w("## Handoff: release → next holder\n\n")
	w("![handoff latency by library](%s)\n\n", r.svg)
	w("%d goroutines, each with its own `*sql.DB`, contend for one name. ", 3)
	w("The time runs from the moment the holder calls its release to the moment a contender that was already waiting returns from its acquire. ")
	w("The holder releases only once every other contender waits (for server-side waits: once their sessions are queued in `pg_locks`, or a woken `LeaseLock` waiter has its place next in line in the lease's row; ")
	w("for pollers: 5 ms plus a random part of the poll period after they started, so releases fall at random points of their cycle), ")
	w("and a contender that released queues again only after someone else got the lock (no barging). ")
	w("The first %d handoffs of a run are not measured: by then every contender has waited once, so its pool has opened its sessions and a LeaseLock waiter's handle its listener. ", 3)
	w("Right before each release the holder times a `SELECT 1` on a connection of its own (same driver): the `SELECT 1` column is the median of those, so the ratio compares times taken under the same load.\n\n")
	w("| library | driver | waits | p50 | p99 | `SELECT 1` p50 | p50 × `SELECT 1` | p50 × best peer |\n|---|---|---|---:|---:|---:|---:|---:|\n")
	for _, row := range handoffRows {
		for _, drv := range []string{"pq", "pgx", "sqlite"} {
			name := "BenchmarkHandoff/" + row.lib + "/" + drv
			p50, ok := r.res.median(name, "p50-us")
			if !ok {
				continue
			}
			p99, _ := r.res.median(name, "p99-us")
			unit, _ := r.res.median(name, "select1-p50-us")
			unitCol, peerCol := "–", "–"
			if x, ok := r.res.median(name, "p50-x-select1"); ok {
				unitCol = ratio(x)
			}
			if peer, pv, pok := r.bestHandoffPeer(drv); pok {
				peerCol = fmt.Sprintf("%s (%s)", ratio(p50/pv), peer)
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", row.label, drv, row.wait, dur(p50*1e3), dur(p99*1e3), dur(unit*1e3), unitCol, peerCol)
		}
	}
	w("\n")
}

func (r *report) bestHandoffPeer(drv string) (string, float64, bool) {
	best, bestV, ok := "", math.Inf(1), false
	for _, p := range handoffPeers {
		if v, found := r.res.median("BenchmarkHandoff/"+p+"/"+drv, "p50-us"); found && v < bestV {
			best, bestV, ok = p, v, true
		}
	}
	return best, bestV, ok
}

func (r *report) writeScaling(w func(string, ...any)) {
	w("## Contention and scaling\n\n")
	w("g goroutines share one `*sql.DB` whose pool has `pool` connections. Throughput in operations per second; ")
	w("\"× g=1\" compares with one goroutine in the same mode (pool 8), \"× `SELECT 1`\" with `SELECT 1` in the same cell. ")
	w("On one name the critical sections run one at a time, so that throughput is the handoff rate. ")
	w("Every held lock pins a connection: with more goroutines than connections, the rest wait for the pool.\n\n")
	for _, d := range pgDrivers {
		w("**%s**\n\n| mode | g | pool | ops/s | × g=1 | × `SELECT 1` |\n|---|---:|---:|---:|---:|---:|\n", d.label)
		for _, mode := range scalingModes {
			base, bok := r.res.median(fmt.Sprintf("BenchmarkScaling/%s/%s/g=1/pool=8", d.id, mode.id), "ops/s")
			for _, c := range scalingCells {
				v, ok := r.res.median(fmt.Sprintf("BenchmarkScaling/%s/%s/g=%d/pool=%d", d.id, mode.id, c.g, c.pool), "ops/s")
				if !ok {
					continue
				}
				baseCol, selCol := "–", "–"
				if bok {
					baseCol = ratio(v / base)
				}
				if s, sok := r.res.median(fmt.Sprintf("BenchmarkScaling/%s/select1/g=%d/pool=%d", d.id, c.g, c.pool), "ops/s"); sok {
					selCol = ratio(v / s)
				}
				w("| %s | %d | %d | %.0f | %s | %s |\n", mode.label, c.g, c.pool, v, baseCol, selCol)
			}
		}
		w("\n")
	}
}

func (r *report) writeHow(w func(string, ...any)) {
	w("## How this was run\n\n")
	w("```sh\ncd benchmarks\n%s\n```\n\n", r.cmdline)
	passes := 0
	for _, g := range r.gs {
		passes = max(passes, g.passes)
	}
	w("which builds the test binary once and runs %d passes; each pass runs each group below that has passes left once ", passes)
	w("(so the runs of a benchmark are spread over the whole run), with PostgreSQL (and a local MariaDB) pinned to CPU 0 and the benchmarks to the other CPUs; ")
	w("a group marked \"also unpinned\" then runs again at once with the servers given back all CPUs and the benchmarks unpinned. ")
	w("Benchmark functions no group names (MySQL's, the observer's, …) run in \"other benchmarks\". As `go test` commands (the pinning done with `taskset`):\n\n```sh\n")
	w("for pass in $(seq %d); do\n", passes)
	for _, g := range r.gs {
		also := ""
		if g.unpinned {
			also = ", also unpinned"
		}
		w("  # %s, passes: %d%s\n  [ $pass -le %d ] && %s\n", g.name, g.passes, also, g.passes, g.goTestCommand())
	}
	w("done > %s\n", r.rawPath)
	w("go tool benchstat %s\n```\n\n", r.rawPath)
	w("The server is `ADVISORYLOCK_TEST_POSTGRES`, else `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`. ")
	w("`-quick` (or `-short`) makes one short pass for development; `-from %s` rewrites this file, details.md and the chart from saved output without running anything. ", r.rawPath)
	w("Round trips are counted in a separate pass, through an in-process TCP proxy that counts the server's ReadyForQuery messages.\n\n")
}

// ratio formats a ratio.
func ratio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", x)
}

// dur formats nanoseconds with three significant digits.
func dur(ns float64) string {
	switch {
	case ns >= 1e9:
		return sig(ns/1e9) + " s"
	case ns >= 1e6:
		return sig(ns/1e6) + " ms"
	case ns >= 1e3:
		return sig(ns/1e3) + " µs"
	default:
		return sig(ns) + " ns"
	}
}

func sig(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}
