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
	{"raw_pool", "raw: pool checkout, try + unlock as literals, back to the pool", "session"},
	{"raw_pool_bounded", "raw: the same, unlock on its own 5s-bounded context (what `Release` must do)", "session"},
	{"raw_pool_ask", "raw: the same, unlock in a goroutine abandoned at the bound (survives a network cut lib/pq does not notice)", "session"},
	{"raw_pool_ask_nowatch", "raw: as above, the statement's own context without Done (no database/sql or driver watcher)", "session"},
	{"trylock_release", "**advisorylock `TryLock` + `Release`** (pool checkout included)", "session"},
	{"trylock_release_nokeepalive", "advisorylock `TryLock` + `Release`, `WithKeepAlive(0)`", "session"},
	{"trylock_release_noop", "advisorylock `TryLock` + `Release`, `WithObserver(NoopObserver{})`", "session"},
	{"trylock_release_prom", "advisorylock `TryLock` + `Release`, observed by `advisorylockprom`", "session"},
	{"trylock_release_otel", "advisorylock `TryLock` + `Release`, observed by `advisorylockotel` (SDK, metrics)", "session"},
	{"trylock_release_otel_traced", "advisorylock `TryLock` + `Release`, observed by `advisorylockotel` in a trace (metrics and two spans)", "session"},
	{"trydo", "**advisorylock `TryDo`** (no-op fn)", "session"},
	{"lock_release", "advisorylock `Lock` + `Release`, uncontended", "session"},
	{"goose_session", "peer: goose v3 session locker, lock + unlock (pinned)", "session"},
	{"migrate", "peer: golang-migrate postgres `Lock` + `Unlock` (pinned)", "session"},
	{"leaselock", "**advisorylock `LeaseLock` `TryLock` + `Release`**", "lease"},
	{"lease_raw_param", "raw lease upsert + release, parameterized, release unbounded", "lease"},
	{"lease_raw_param_bounded", "raw lease, parameterized, release on its own 5s-bounded context as `Release` must (the floor)", "lease"},
	{"lease_raw_literal", "raw lease upsert + release, literals", "lease"},
	{"lease_raw_literal_async_release", "raw lease, literals, release with `synchronous_commit = off`", "lease"},
	{"goose_table", "peer: goose v3 table (lease-row) locker, `Lock` + `Unlock`", "lease"},
}

var peersOf = map[string][]string{
	"session": {"goose_session", "migrate"},
	"lease":   {"goose_table"},
}

var sqliteRows = []struct{ op, label, floor string }{
	{"select1", "`SELECT 1` — **the unit**", ""},
	{"raw_lock", "raw lock row: upsert + delete (floor of `Lock`)", ""},
	{"lock", "**advisorylock `Lock`: `TryLock` + `Release`**", "raw_lock"},
	{"raw_lease", "raw lease row: upsert with generation + release (floor of `LeaseLock`)", ""},
	{"leaselock", "**advisorylock `LeaseLock`: `TryLock` + `Release`**", "raw_lease"},
}

// handoffRows are the handoff benchmarks in the order shown; kind colours
// the chart.
var handoffRows = []struct{ lib, label, kind, wait string }{
	{"advisorylock", "advisorylock `Lock`", "ours", "server-side, 1s slices"},
	{"raw_blocking", "raw `pg_advisory_lock($1)`", "floor", "server-side, unbounded"},
	{"migrate", "golang-migrate `Lock`", "peer", "server-side, unbounded"},
	{"leaselock", "advisorylock `LeaseLock`", "ours", "polls every 20ms"},
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
	res      results
	m        machine
	gs       []group
	cmdline  string
	stat     string
	rawPath  string
	svg      string
	suiteErr error
	targets  []target
}

// target is one SPEC section 7 target, checked on one driver.
type target struct {
	what, driver, measured, limit string
	met                           *bool // nil when not measured
}

func newReport(res results, m machine, gs []group, cmdline, stat, rawPath, svg string, suiteErr error) *report {
	r := &report{res: res, m: m, gs: gs, cmdline: cmdline, stat: stat, rawPath: rawPath, svg: svg, suiteErr: suiteErr}
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

func (r *report) checkTargets() []target {
	var ts []target
	check := func(what, drv string, measuredOK bool, limit string, met bool, measured string) {
		t := target{what: what, driver: drv, limit: limit}
		if measuredOK {
			t.measured = measured
			t.met = &met
		} else {
			t.measured = "not measured"
		}
		ts = append(ts, t)
	}
	for _, d := range pgDrivers {
		v, ok := r.res.median("BenchmarkPaired/trylock_release_vs_select1_pinned/"+d.id, "x-base")
		seq := r.seqRatio(pgName("trylock_release", d.id), pgName("select1_pinned", d.id))
		check("uncontended `TryLock`+`Release` (pool checkout included) ≤ 2.2× `SELECT 1`", d.label, ok, "2.2×", v <= 2.2,
			fine(v, 2.2)+" paired; "+seq+" sequential")
	}
	for _, d := range pgDrivers {
		v, ok := r.res.median("BenchmarkHandoff/advisorylock/"+d.id, "p50-x-select1")
		p50, _ := r.res.median("BenchmarkHandoff/advisorylock/"+d.id, "p50-us")
		check("handoff: a blocked `Lock` gets the lock within 3× `SELECT 1` (p50) of the release", d.label, ok, "3×", v <= 3,
			fmt.Sprintf("%s (%s)", fine(v, 3), dur(p50*1e3)))
	}
	for _, d := range pgDrivers {
		ours, ok := r.res.median("BenchmarkHandoff/advisorylock/"+d.id, "p50-us")
		slowest, peer := math.Inf(1), ""
		for _, p := range []string{"goose_table", "goose_session"} {
			if v, found := r.res.median("BenchmarkHandoff/"+p+"/"+d.id, "p50-us"); found && v < slowest {
				slowest, peer = v, p
			}
		}
		ok = ok && peer != ""
		check("handoff p50 ≥ 20× faster than every polling peer", d.label, ok, "20×", slowest/ours >= 20,
			fmt.Sprintf("%s faster than %s", ratio(slowest/ours), peer))
	}
	for _, d := range pgDrivers {
		v, ok := r.res.median("BenchmarkPaired/goose_table_vs_leaselock/"+d.id, "x-base")
		seq := r.seqRatio(pgName("goose_table", d.id), pgName("leaselock", d.id))
		check("`LeaseLock` acquire+release ≥ 1.5× faster than goose's table locker", d.label, ok, "1.5×", v >= 1.5,
			fine(v, 1.5)+" paired; "+seq+" sequential")
	}
	allocs := func(what, drv, ours, floor string) {
		o, ook := r.res.median(ours, "allocs/op")
		f, fok := r.res.median(floor, "allocs/op")
		check(what, drv, ook && fok, "floor + 10", o <= f+10, fmt.Sprintf("%.0f vs %.0f (%+.0f)", o, f, o-f))
	}
	for _, d := range pgDrivers {
		for _, op := range []string{"trylock_release", "trydo", "lock_release"} {
			allocs(fmt.Sprintf("allocs/op of `%s` ≤ raw floor (`raw_param`) + 10", op), d.label, pgName(op, d.id), pgName("raw_param", d.id))
		}
		allocs("allocs/op of `leaselock` ≤ raw floor (`lease_raw_param_bounded`) + 10", d.label, pgName("leaselock", d.id), pgName("lease_raw_param_bounded", d.id))
	}
	allocs("allocs/op of SQLite `lock` ≤ raw floor + 10", "sqlite", "BenchmarkSQLite/lock", "BenchmarkSQLite/raw_lock")
	allocs("allocs/op of SQLite `leaselock` ≤ raw floor + 10", "sqlite", "BenchmarkSQLite/leaselock", "BenchmarkSQLite/raw_lease")
	return ts
}

// seqRatio is the ratio of two benchmarks' median iterations, measured
// one after the other.
func (r *report) seqRatio(a, b string) string {
	x, xok := r.ns(a)
	y, yok := r.ns(b)
	if !xok || !yok {
		return "–"
	}
	return ratio(x / y)
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
		fmt.Fprintf(&b, "%s %s [%s]: %s\n", mark(t.met), stripMD(t.what), t.driver, t.measured)
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

func (r *report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# advisorylock benchmarks\n\n")
	w("Generated by `%s` (in `benchmarks/`) on %s; do not edit by hand.\n", r.cmdline, r.m.Started.UTC().Format("2006-01-02 15:04 UTC"))
	w("Raw output: [`%s`](%s); the benchmarks are the `_test.go` files of this directory.\n\n", r.rawPath, r.rawPath)
	if r.suiteErr != nil {
		w("> **Some benchmarks failed in this run:** %s. Their rows are missing below.\n\n", r.suiteErr)
	}
	w("Every figure is the median of its runs in this one run, against one server. ")
	w("The machine is shared and noisy, so compare **ratios within the run**, not absolute times across runs. ")
	w("Where it can, the report pins PostgreSQL to CPU 0 and the benchmarks to the other CPUs (see \"CPU pinning\" below): ")
	w("every round trip then crosses CPUs, as it would to a database on another host, instead of sometimes sharing one CPU and taking a sixth of the time, which made ratios swing between runs. ")
	w("The unit is `SELECT 1` on a pinned connection with the same driver: one round trip. ")
	w("\"× best peer\" divides by the fastest peer doing the same job on the same driver ")
	w("(session locks: goose v3's session locker and golang-migrate's postgres driver; leases: goose v3's table locker); below 1 is faster than the peer.\n\n")

	r.writeTargets(w)
	r.writeMachine(w)
	r.writePaired(w)
	for _, d := range []struct{ id, label string }{{"pq", "lib/pq"}, {"pgx", "pgx (stdlib, default exec mode cache_statement)"}} {
		r.writeOps(w, d.id, d.label)
	}
	r.writeSQLite(w)
	r.writeHandoff(w)
	r.writeScaling(w)
	r.writeHow(w)
	w("## benchstat\n\n<details><summary><code>go tool benchstat %s</code></summary>\n\n```\n%s```\n</details>\n", r.rawPath, r.stat)
	return b.String()
}

func (r *report) writeTargets(w func(string, ...any)) {
	w("## Targets (SPEC section 7)\n\n")
	w("Verdicts use the paired ratios (see below), which hold best on a loaded machine; the sequential ratio, from the per-op tables, is shown beside them. ")
	w("Handoffs are compared with a `SELECT 1` timed inside the same benchmark. Polling peers are configured as listed in the handoff table.\n\n")
	w("| | target | driver | measured | limit |\n|---|---|---|---|---|\n")
	for _, t := range r.targets {
		w("| %s | %s | %s | %s | %s |\n", mark(t.met), t.what, t.driver, t.measured, t.limit)
	}
	w("\n")
	r.writeLeaseFloor(w)
	written := map[string]bool{}
	for _, t := range r.targets {
		if t.met == nil || *t.met || written[t.what] {
			continue
		}
		if why := missWhy(t.what); why != "" {
			if len(written) == 0 {
				w("### Misses, and why\n\n")
			}
			written[t.what] = true
			w("- **%s**: %s\n", t.what, why)
		}
	}
	if len(written) > 0 {
		w("\n")
	}
}

// writeLeaseFloor says which floor LeaseLock's allocations are held to,
// and what the bare statements would make of it.
func (r *report) writeLeaseFloor(w func(string, ...any)) {
	var parts []string
	for _, d := range pgDrivers {
		o, ook := r.res.median(pgName("leaselock", d.id), "allocs/op")
		bare, bok := r.res.median(pgName("lease_raw_param", d.id), "allocs/op")
		bounded, dok := r.res.median(pgName("lease_raw_param_bounded", d.id), "allocs/op")
		if ook && bok && dok {
			parts = append(parts, fmt.Sprintf("%s %+.0f (the bound alone costs the floor %.0f)", d.label, o-bare, bounded-bare))
		}
	}
	if len(parts) == 0 {
		return
	}
	w("The allocation floor of `LeaseLock` is its two statements with the release bounded as `Release` must bound it, on a context of its own "+
		"(`lease_raw_param_bounded`); a release that can hang on a dead network is not the same operation. "+
		"Against the bare statements (`lease_raw_param`) `LeaseLock` allocates: %s.\n\n", strings.Join(parts, "; "))
}

// missWhy explains a target that was missed, from what profiles and the
// round-trip counts showed; "" where there is nothing known to say.
func missWhy(what string) string {
	switch {
	case strings.Contains(what, "`TryLock`+`Release`"):
		return "the protocol floor alone (try and unlock as literals, pinned, no pool) is about 2.0× (see the paired table); " +
			"the pool checkout, the release's own bounded context and, on lib/pq, the goroutine that lets a release be abandoned on a dead network (lib/pq#620) must fit in the 0.2× left. " +
			"Both statements are already Execs whose row count is the answer; the ratio moves by a few hundredths from run to run."
	case strings.Contains(what, "`LeaseLock` acquire+release"):
		return "both are bound by the WAL flush of the acquire's commit; the release already commits without waiting for it."
	case strings.Contains(what, "SQLite"):
		return "the floor runs both statements on the handle, as the library does. The library also bounds the release " +
			"(by time where the pool has no SetMaxOpenConns limit; else by a context of its own, about 7 with the driver's interrupt goroutine), " +
			"and holds a Guard with its cleanup (3), an owner label unique to the acquire (1) and the keeper's start timer (3)."
	case strings.Contains(what, "`leaselock`"):
		return "beyond the bounded floor, a LeaseLock makes an owner label unique to the acquire (1), arms its keeper's start timer (3) and gives the Guard a cleanup (3); " +
			"on lib/pq, a statement runs in a goroutine that can be abandoned on a dead network (lib/pq#620), about 3 a statement."
	}
	return ""
}

func (r *report) writeMachine(w func(string, ...any)) {
	m := r.m
	w("## Machine and versions\n\n")
	w("- CPU: %d × %s (%s); load average %s before the run, %s after\n", m.CPUs, m.CPUModel, m.OS, m.LoadBefore, m.LoadAfter)
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
	w("| operation | p50 | mean | × `SELECT 1` | × best peer | round trips | B/op | allocs/op |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
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
			w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, dur(v), dur(mean), unitCol, peerCol,
				r.num("BenchmarkRoundTrips/"+row.op+"/"+d, "rt/op", "%.1f"), r.num(name, "B/op", "%.0f"), r.num(name, "allocs/op", "%.0f"))
		}
	}
	w("\n")
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
	{"raw_literal", "select1_pinned", "raw try + unlock (literal, pinned) vs `SELECT 1`"},
	{"raw_pool", "raw_literal", "cost of the pool checkout: `raw_pool` vs `raw_literal`"},
	{"raw_pool_bounded", "raw_pool", "cost of a bounded release context: `raw_pool_bounded` vs `raw_pool`"},
	{"raw_pool_ask", "raw_pool", "cost of an abandonable release goroutine: `raw_pool_ask` vs `raw_pool`"},
	{"raw_pool_ask_nowatch", "raw_pool", "the same without context watchers: `raw_pool_ask_nowatch` vs `raw_pool`"},
	{"raw_param", "select1_pinned", "raw try + unlock (`$1`, pinned) vs `SELECT 1`"},
	{"goose_session", "select1_pinned", "goose session locker vs `SELECT 1`"},
	{"trylock_release", "select1_pinned", "**`TryLock`+`Release`** vs `SELECT 1`"},
	{"trylock_release_nokeepalive", "select1_pinned", "`TryLock`+`Release`, `WithKeepAlive(0)`, vs `SELECT 1`"},
	{"trydo", "select1_pinned", "**`TryDo`** vs `SELECT 1`"},
	{"trylock_release", "raw_pool_bounded", "`TryLock`+`Release` vs `raw_pool_bounded`"},
	{"trylock_release", "raw_pool_ask", "`TryLock`+`Release` vs its hand-written equivalent (`raw_pool_ask`)"},
	{"trylock_release", "trylock_release_nokeepalive", "`TryLock`+`Release` vs the same with `WithKeepAlive(0)`"},
	{"trylock_release_noop", "trylock_release", "cost of the observer's call sites: no-op `Observer` vs none"},
	{"trylock_release_prom", "trylock_release", "`TryLock`+`Release` observed by Prometheus vs not observed (limit 1.05)"},
	{"trylock_release_otel", "trylock_release", "`TryLock`+`Release` observed by OpenTelemetry (metrics) vs not observed (limit 1.05)"},
	{"trylock_release_otel_traced", "trylock_release", "`TryLock`+`Release` observed by OpenTelemetry in a trace vs not observed"},
	{"goose_table", "leaselock", "goose table locker vs **`LeaseLock`**"},
}

func (r *report) writePaired(w func(string, ...any)) {
	w("## Paired ratios\n\n")
	w("Two operations alternate iteration by iteration on one handle (the order flips every iteration); the ratio is of their median iteration times, ")
	w("so load that comes and goes hits both alike. The targets above use these.\n\n")
	w("| pair | driver | op p50 | base p50 | ratio |\n|---|---|---:|---:|---:|\n")
	for _, p := range pairedRows {
		for _, d := range pgDrivers {
			name := "BenchmarkPaired/" + p.op + "_vs_" + p.base + "/" + d.id
			x, ok := r.res.median(name, "x-base")
			if !ok {
				continue
			}
			op, _ := r.res.median(name, "op-p50-ns")
			base, _ := r.res.median(name, "base-p50-ns")
			w("| %s | %s | %s | %s | %s |\n", p.label, d.id, dur(op), dur(base), ratio(x))
		}
	}
	w("\n")
}

func (r *report) writeSQLite(w func(string, ...any)) {
	w("## Uncontended operations — SQLite\n\n")
	w("| operation | p50 | mean | × `SELECT 1` | × raw floor | B/op | allocs/op |\n|---|---:|---:|---:|---:|---:|---:|\n")
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
		w("| %s | %s | %s | %s | %s | %s | %s |\n", row.label, dur(v), dur(mean), unitCol, floorCol, r.num(name, "B/op", "%.0f"), r.num(name, "allocs/op", "%.0f"))
	}
	w("\nEach acquire and release commits a write transaction, so these are bound by the disk's sync, not by SQL.\n\n")
}

func (r *report) writeHandoff(w func(string, ...any)) {
	w("## Handoff: release → next holder\n\n")
	w("![handoff latency by library](%s)\n\n", r.svg)
	w("%d goroutines, each with its own `*sql.DB`, contend for one name. ", 3)
	w("The time runs from the moment the holder calls its release to the moment a contender that was already waiting returns from its acquire. ")
	w("The holder releases only once every other contender waits (for server-side waits: once their sessions are queued in `pg_locks`; ")
	w("for pollers: 5 ms plus a random part of the poll period after they started, so releases fall at random points of their cycle), ")
	w("and a contender that released queues again only after someone else got the lock (no barging). ")
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
	w("(so the runs of a benchmark are spread over the whole run). As `go test` commands:\n\n```sh\n")
	w("for pass in $(seq %d); do\n", passes)
	for _, g := range r.gs {
		w("  # %s, passes: %d\n  [ $pass -le %d ] && %s\n", g.name, g.passes, g.passes, g.goTestCommand())
	}
	w("done > %s\n", r.rawPath)
	w("go tool benchstat %s\n```\n\n", r.rawPath)
	w("The server is `ADVISORYLOCK_TEST_POSTGRES`, else `postgres://postgres@127.0.0.1:5432/test?sslmode=disable`. ")
	w("`-quick` (or `-short`) makes one short pass for development; `-from %s` rewrites this file and the chart from saved output without running anything. ", r.rawPath)
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
