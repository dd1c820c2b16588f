package benchmarks

import (
	"bufio"
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// BenchmarkPeersPinnedFloor runs the pinned throughput lap of
// Peers/throughput (32 goroutines over 256 names, a pool of
// peerPinnedPool) three ways, interleaved: redislock, advisorylock pinned
// (WithMultiplexing(0)), and the bare statements a user would write for
// the same lock on a connection of the pool (pg_try_advisory_lock, then
// pg_advisory_unlock; the key a bound argument on pgx, a literal on lib/pq,
// which sends a statement with arguments as two round trips). It says how
// far the pinned rows' gap to redislock is the library's, and how far the
// two statements' on a server session each. Per row L: L-ops/s,
// L-x-redislock, and the CPU time an operation costs the benchmark
// process (L-client-us/op, getrusage) and the server (L-server-us/op: the
// row's PostgreSQL backends, found by their application_name, or Redis's
// process, read from /proc; left out when the server runs elsewhere).
func BenchmarkPeersPinnedFloor(b *testing.B) {
	for _, drv := range pgDrivers {
		b.Run(drv, func(b *testing.B) {
			admin := openPG(b, drv, postgresDSN(), 1)
			rows := []floorRow{redisFloorRow(b), pinnedFloorRow(b, admin, drv, false), pinnedFloorRow(b, admin, drv, true)}
			for _, r := range rows { // each name's first Lock is not the steady state
				_, err := lap(r.locks)
				must(b, err, r.name+" warm-up lap")
			}
			wall := make([]time.Duration, len(rows))
			client := make([]time.Duration, len(rows))
			server := make([]time.Duration, len(rows))
			serverSeen := true
			interleave(b, len(rows), func(p, _ int) {
				pids := rows[p].server()
				s0, ok0 := cpuOf(pids)
				c0 := selfCPU()
				d, err := lap(rows[p].locks)
				c1 := selfCPU()
				s1, ok1 := cpuOf(pids)
				if err != nil {
					b.Fatalf("%s: %v", rows[p].name, err)
				}
				wall[p] += d
				client[p] += c1 - c0
				server[p] += s1 - s0
				serverSeen = serverSeen && ok0 && ok1
			})
			ops := float64(b.N * peerLap)
			for p, r := range rows {
				b.ReportMetric(ops/wall[p].Seconds(), r.name+"-ops/s")
				if p > 0 {
					b.ReportMetric(wall[0].Seconds()/wall[p].Seconds(), r.name+"-x-redislock")
				}
				b.ReportMetric(us(client[p])/ops, r.name+"-client-us/op")
				if serverSeen {
					b.ReportMetric(us(server[p])/ops, r.name+"-server-us/op")
				}
			}
		})
	}
}

// floorRow is one row of BenchmarkPeersPinnedFloor: its locks, and the
// processes of its server's sessions.
type floorRow struct {
	name   string
	locks  []peerLock
	server func() []int
}

// redisFloorRow is redislock's row; its server is the Redis process.
func redisFloorRow(b *testing.B) floorRow {
	open := openRedislock(b)
	locks := make([]peerLock, peerNames)
	for i := range locks {
		locks[i] = open(lockName(b, "redislock/t"+strconv.Itoa(i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	info, err := openRedis(b).Info(ctx, "server").Result()
	must(b, err, "Redis INFO server")
	var pids []int
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "process_id:"); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return floorRow{"redislock", locks, func() []int { return pids }}
}

// pinnedFloorRow is drv's pinned row (bare false) or its bare statements'
// (bare true), on a pool of its own whose sessions carry an
// application_name of their own, by which admin finds their backends.
func pinnedFloorRow(b *testing.B, admin *sql.DB, drv string, bare bool) floorRow {
	name := drv + "-pinned"
	if bare {
		name = drv + "-bare"
	}
	app := "advisorylock_bench_" + strings.ReplaceAll(name, "-", "_")
	db := openPG(b, drv, withParam(postgresDSN(), "application_name", app), peerPinnedPool)
	warm(b, db, 4)
	locks := make([]peerLock, peerNames)
	for i := range locks {
		n := lockName(b, name+"/t"+strconv.Itoa(i))
		if bare {
			locks[i] = bareLock(db, drv, advisorylock.Key(n))
			continue
		}
		l := newLock(b, db, n, peerPinned...)
		locks[i] = peerLock{lock: func(ctx context.Context) (func(context.Context) error, error) {
			g, err := l.Lock(ctx)
			if err != nil {
				return nil, err
			}
			return g.Release, nil
		}}
	}
	pids := func() []int {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		rs, err := admin.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app)
		must(b, err, "find the row's backends")
		defer rs.Close()
		var ps []int
		for rs.Next() {
			var pid int
			must(b, rs.Scan(&pid), "scan a backend's pid")
			ps = append(ps, pid)
		}
		must(b, rs.Err(), "find the row's backends")
		return ps
	}
	return floorRow{name, locks, pids}
}

// bareLock is key's lock as bare statements on a connection of db's
// pool, held from the try to the unlock; an uncontended try that misses
// is errNotGranted.
func bareLock(db *sql.DB, drv string, key int64) peerLock {
	try, unlock := "SELECT WHERE pg_try_advisory_lock($1::bigint)", "SELECT WHERE pg_advisory_unlock($1::bigint)"
	args := []any{key}
	if drv != "pgx" {
		lit := strconv.FormatInt(key, 10)
		if key < 0 {
			lit = "(" + lit + ")"
		}
		try, unlock = strings.Replace(try, "$1", lit, 1), strings.Replace(unlock, "$1", lit, 1)
		args = nil
	}
	lock := func(ctx context.Context) (func(context.Context) error, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		res, err := conn.ExecContext(ctx, try, args...)
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			_ = conn.Close()
			return nil, errNotGranted
		}
		return func(ctx context.Context) error {
			defer conn.Close()
			_, err := conn.ExecContext(ctx, unlock, args...)
			return err
		}, nil
	}
	return peerLock{try: lock, lock: lock}
}

// selfCPU is the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf sums the CPU time of pids, from /proc's schedstat (nanoseconds;
// /proc's stat counts in ticks of 10 ms, coarser than a lap's server
// time); false when one cannot be read (the server runs elsewhere).
func cpuOf(pids []int) (time.Duration, bool) {
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b)) // time on a CPU, time waiting for one (ns), timeslices
		if len(f) < 1 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += time.Duration(ns)
	}
	return sum, len(pids) > 0
}
