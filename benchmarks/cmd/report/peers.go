package main

import "fmt"

// peerRows are BenchmarkPeers' libraries (benchmarks/peers_test.go), in
// the order shown, with their labels; redislock is the base of the ratios.
var peerRows = []struct{ id, label string }{
	{"redislock", "redislock (Redis, `SET NX` + Lua release; polls every 20 ms)"},
	{"redsync", "redsync (Redis, one node; polls every 20 ms)"},
	{"etcd", "etcd `concurrency.Mutex` (embedded server, one member; waits on a watch)"},
	{"pq-pinned", "advisorylock `Lock`, lib/pq, pinned (a connection per held lock, pool of 16)"},
	{"pq-mux", "advisorylock `Lock`, lib/pq, `WithMultiplexing(4)`, pool of 8"},
	{"pgx-pinned", "advisorylock `Lock`, pgx, pinned, pool of 16"},
	{"pgx-mux", "advisorylock `Lock`, pgx, `WithMultiplexing(4)`, pool of 8"},
	{"mysql-pinned", "advisorylock `Lock`, MariaDB, pinned, pool of 16"},
	{"mysql-mux", "advisorylock `Lock`, MariaDB, `WithMultiplexing(4)`, pool of 8"},
}

// peerGroups are the report's groups of BenchmarkPeers, one per
// sub-benchmark (each wants its own -benchtime), all also unpinned.
func peerGroups(count int) []group {
	return []group{
		{"peers: try+release", `^BenchmarkPeers$/^try_release$`, "300x", count, true},
		{"peers: handoff", `^BenchmarkPeers$/^handoff$`, "300x", count, true},
		{"peers: throughput", `^BenchmarkPeers$/^throughput$`, "20x", count, true},
		{"peers: held names", `^BenchmarkPeers$/^held$`, "6x", count, true},
		{"peers: the pinned rows' floor", `^BenchmarkPeersPinnedFloor$`, "40x", count, false},
	}
}

// writePeers shows advisorylock beside redislock, redsync and etcd, from
// BenchmarkPeers: pinned, then unpinned.
func (r *report) writePeers(w func(string, ...any)) {
	w("## Beside Redis and etcd locks\n\n")
	if _, ok := r.res.median("BenchmarkPeers/throughput", "redislock-ops/s"); !ok {
		w("Not measured in this run (`BenchmarkPeers` did not run).\n\n")
		return
	}
	w("From `BenchmarkPeers` (`peers_test.go`): redislock and redsync on the Redis at 127.0.0.1:6379 (not pinned), etcd's `concurrency.Mutex` on an etcd server embedded in the benchmark process (on the benchmark's CPUs, fsync on), ")
	w("advisorylock on the PostgreSQL and MariaDB of the rest of this report. Each row ran in the same benchmarks as the others, interleaved: every iteration runs each library once, in a turning order. ")
	w("Try+release: one `TryLock` and its `Release` of a free name (median). Handoff: two contenders take turns on one name, the holder releasing once the other waits, timed from the release call to the waiter's return; ")
	w("the Redis peers poll every 20 ms (redislock has no retry by default, redsync a random 50–250 ms), as the other pollers of this report, and their holder releases 5 ms plus a random part of 20 ms after the waiter started. ")
	w("Throughput: 32 goroutines over 256 names, each operation a blocking `Lock`, a counter's increment and the `Release`; goroutine g takes names g, g+32, … so no two want the same name. ")
	w("Held names: 256 names taken one after another on one client and then released (the pinned rows would need a connection each, and are left out). \"× redislock\" divides by redislock's figure in the same benchmark.\n\n")
	r.writePeerTable(w, r.res)
	if _, ok := r.unp.median("BenchmarkPeers/throughput", "redislock-ops/s"); ok {
		w("Unpinned (the same benchmarks right after, with nothing pinned):\n\n")
		r.writePeerTable(w, r.unp)
	}
	r.writeFloor(w)
}

// floorName is BenchmarkPeersPinnedFloor's sub-benchmark for driver drv.
func floorName(drv string) string { return "BenchmarkPeersPinnedFloor/" + drv }

// writeFloor shows the pinned throughput rows beside the bare statements
// a user would write for the same lock, from BenchmarkPeersPinnedFloor:
// how much of the pinned rows' gap to redislock is the library's.
func (r *report) writeFloor(w func(string, ...any)) {
	if _, ok := r.res.median(floorName("pgx"), "redislock-ops/s"); !ok {
		return
	}
	w("### The pinned rows' floor\n\n")
	w("From `BenchmarkPeersPinnedFloor` (`peers_floor_test.go`, in the pinned phase): the throughput lap above run three ways, interleaved, on pools of their own: redislock, the pinned `Lock`, and the bare statements a user would write for the same lock on a connection of the pool (`pg_try_advisory_lock`, then `pg_advisory_unlock`). ")
	w("CPU per operation: the benchmark process's (getrusage) and the server's (the row's PostgreSQL backends, or Redis's process, from /proc's schedstat). Medians of the passes; \"× bare\" divides the medians.\n\n")
	w("| driver | row | throughput | × redislock | × bare | client CPU/op | server CPU/op |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, d := range pgDrivers {
		name := floorName(d.id)
		bare, bareOK := r.res.median(name, d.id+"-bare-ops/s")
		for _, row := range []struct{ id, label string }{{"redislock", "redislock"}, {d.id + "-pinned", "`Lock`, pinned"}, {d.id + "-bare", "bare statements"}} {
			ops, ok := r.res.median(name, row.id+"-ops/s")
			if !ok {
				continue
			}
			x, xBare := "1.00×", "–"
			if row.id != "redislock" {
				x = "–"
				if v, ok := r.res.median(name, row.id+"-x-redislock"); ok {
					x = ratio(v)
				}
				if bareOK && bare > 0 {
					xBare = ratio(ops / bare)
				}
			}
			cpu := func(unit string) string {
				if v, ok := r.res.median(name, row.id+"-"+unit); ok && v > 0 {
					return dur(v * 1e3)
				}
				return "–"
			}
			w("| %s | %s | %.0f ops/s | %s | %s | %s | %s |\n", d.label, row.label, ops, x, xBare, cpu("client-us/op"), cpu("server-us/op"))
		}
	}
	w("\n")
}

// floorWhy says, for the pinned throughput gate on driver drv, how the
// bare statements and the pinned Lock compared in BenchmarkPeersPinnedFloor.
func (r *report) floorWhy(drv string) string {
	name := floorName(drv)
	bare, ok1 := r.res.median(name, drv+"-bare-x-redislock")
	pinnedOps, ok2 := r.res.median(name, drv+"-pinned-ops/s")
	bareOps, ok3 := r.res.median(name, drv+"-bare-ops/s")
	if !ok1 || !ok2 || !ok3 || bareOps == 0 {
		return ""
	}
	return fmt.Sprintf(" In this run's floor benchmark (\"The pinned rows' floor\", below) the bare statements measured %s redislock, and the pinned `Lock` %s the bare statements.", ratio(bare), ratio(pinnedOps/bareOps))
}

// writePeerTable writes one table of BenchmarkPeers' figures from res.
func (r *report) writePeerTable(w func(string, ...any), res *results) {
	w("| library | try+release p50 | × redislock | handoff p50 | handoff p99 | × redislock (p50) | throughput | × redislock | held: per name | × redislock |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	cell := func(bench, id, unit string, format func(float64) string) (string, string) {
		name := "BenchmarkPeers/" + bench
		v, ok := res.median(name, id+"-"+unit)
		if !ok {
			return "–", "–"
		}
		x := "1.00×"
		if id != peerRows[0].id {
			x = "–"
			if xv, ok := res.median(name, id+"-x-redislock"); ok {
				x = ratio(xv)
			}
		}
		return format(v), x
	}
	usDur := func(v float64) string { return dur(v * 1e3) }
	for _, p := range peerRows {
		try, tryX := cell("try_release", p.id, "p50-us", usDur)
		hand, handX := cell("handoff", p.id, "p50-us", usDur)
		p99, _ := cell("handoff", p.id, "p99-us", usDur)
		ops, opsX := cell("throughput", p.id, "ops/s", func(v float64) string { return fmt.Sprintf("%.0f ops/s", v) })
		held, heldX := cell("held", p.id, "us/name", usDur)
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.label, try, tryX, hand, p99, handX, ops, opsX, held, heldX)
	}
	w("\n")
}
