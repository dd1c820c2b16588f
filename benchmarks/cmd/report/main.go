// Command report runs the advisorylock benchmark suite, summarizes it with
// benchstat, and writes README.md (figures as ratios to SELECT 1 and to the
// best peer, the SPEC section 7 targets met or not, the machine and
// versions, the exact commands) and handoff.svg (handoff latency by
// library). Run it inside benchmarks/:
//
//	go run ./cmd/report           # full: 5 passes, under 10 minutes on 2 cores
//	go run ./cmd/report -quick    # one short pass, for development
//	go run ./cmd/report -from results.txt   # rewrite the README from saved output
//
// The PostgreSQL server is ADVISORYLOCK_TEST_POSTGRES, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// group is a set of benchmarks that share a -benchtime. The suite runs in
// passes: each pass runs every group that still has passes left once
// (-count 1), so the runs of one benchmark are spread over the whole run
// and a burst of load on a shared machine hits all of them alike.
type group struct {
	name      string
	bench     string
	benchtime string
	passes    int
}

// groups returns the suite. The full run takes 5 to 8 minutes on 2 shared
// cores; quick about a minute.
func groups(quick bool, count int) []group {
	if quick {
		return []group{
			{"uncontended ops", `^Benchmark(PG|SQLite)$`, "100ms", 1},
			{"paired ratios", `^BenchmarkPaired$`, "100x", 1},
			{"round trips", `^BenchmarkRoundTrips$`, "20x", 1},
			{"handoff, server-side waits", `^BenchmarkHandoff$/^(advisorylock|raw_blocking|migrate)$`, "50x", 1},
			{"handoff, 20ms pollers", `^BenchmarkHandoff$/^(leaselock|goose_table|sqlite_raw|sqlite_lock|sqlite_leaselock)$`, "10x", 1},
			{"handoff, goose session locker (1s)", `^BenchmarkHandoff$/^goose_session$`, "3x", 1},
			{"scaling", `^BenchmarkScaling$`, "100ms", 1},
		}
	}
	return []group{
		{"uncontended ops", `^Benchmark(PG|SQLite)$`, "300ms", count},
		{"paired ratios", `^BenchmarkPaired$`, "300x", count},
		{"round trips", `^BenchmarkRoundTrips$`, "200x", 1},
		{"handoff, server-side waits", `^BenchmarkHandoff$/^(advisorylock|raw_blocking|migrate)$`, "300x", count},
		{"handoff, 20ms pollers", `^BenchmarkHandoff$/^(leaselock|goose_table|sqlite_raw|sqlite_lock|sqlite_leaselock)$`, "40x", count},
		{"handoff, goose session locker (1s)", `^BenchmarkHandoff$/^goose_session$`, "6x", min(count, 3)},
		{"scaling", `^BenchmarkScaling$`, "300ms", min(count, 3)},
	}
}

// goTestCommand is the go test command equivalent to one pass of g.
func (g group) goTestCommand() string {
	return fmt.Sprintf("go test -run '^$' -bench '%s' -benchtime %s -count 1 -benchmem -timeout 30m .", g.bench, g.benchtime)
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("report: ")
	quick := flag.Bool("quick", false, "one short pass (count 1, short benchtimes), for development")
	short := flag.Bool("short", false, "same as -quick")
	count := flag.Int("count", 5, "passes, and so runs of each benchmark, in the full mode (benchstat wants 5 or more)")
	from := flag.String("from", "", "do not run: rewrite the README and chart from this saved go test output")
	resultsPath := flag.String("results", "results.txt", "where to save the raw go test output")
	readmePath := flag.String("readme", "README.md", "where to write the report")
	svgPath := flag.String("svg", "handoff.svg", "where to write the handoff chart")
	flag.Parse()
	*quick = *quick || *short
	if _, err := os.Stat("cmd/report/main.go"); err != nil {
		log.Fatal("run me inside benchmarks/: go run ./cmd/report")
	}
	dsn := os.Getenv("ADVISORYLOCK_TEST_POSTGRES")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}

	cmdline := "go run ./cmd/report"
	if len(os.Args) > 1 {
		cmdline += " " + strings.Join(os.Args[1:], " ")
	}
	m := describeMachine(".", dsn)
	var raw []byte
	var suiteErr error
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			log.Fatal(err)
		}
		raw = b
		// The run's own facts, saved with its output, replace today's.
		meta := parseMeta(raw)
		cmdline = cmp.Or(meta["report-command"], cmdline+" (the original command was not saved)")
		*quick = meta["report-quick"] == "true" || (meta["report-quick"] == "" && *quick)
		if n, err := strconv.Atoi(meta["report-count"]); err == nil {
			*count = n
		}
		if t, err := time.Parse(time.RFC3339, meta["report-started"]); err == nil {
			m.Started = t
		}
		if d, err := time.ParseDuration(meta["report-took"]); err == nil {
			m.Took = d
		}
		m.LoadBefore = cmp.Or(meta["report-load-before"], "unknown")
		m.LoadAfter = cmp.Or(meta["report-load-after"], "unknown")
		m.Pinning = cmp.Or(meta["report-pinning"], "not recorded")
	} else {
		var all bytes.Buffer
		fmt.Fprintf(&all, "report-command: %s\nreport-quick: %t\nreport-count: %d\nreport-started: %s\nreport-load-before: %s\n",
			cmdline, *quick, *count, m.Started.Format(time.RFC3339), m.LoadBefore)
		pin := pinServer(dsn)
		m.Pinning = pin.desc
		fmt.Fprintf(&all, "report-pinning: %s\n", pin.desc)
		out, err := runSuite(groups(*quick, *count), pin)
		pin.restore()
		all.Write(out)
		suiteErr = err
		if out == nil {
			log.Fatal(suiteErr)
		}
		m.LoadAfter = loadAvg()
		m.Took = time.Since(m.Started)
		fmt.Fprintf(&all, "report-took: %s\nreport-load-after: %s\n", m.Took.Round(time.Second), m.LoadAfter)
		raw = all.Bytes()
		if err := os.WriteFile(*resultsPath, raw, 0o644); err != nil {
			log.Fatal(err)
		}
		*from = *resultsPath
	}
	gs := groups(*quick, *count)

	stat, err := exec.Command("go", "tool", "benchstat", *from).CombinedOutput()
	if err != nil {
		log.Fatalf("benchstat: %v\n%s", err, stat)
	}
	res := parseResults(bytes.NewReader(raw))
	rep := newReport(res, m, gs, cmdline, string(stat), *from, filepath.Base(*svgPath), suiteErr)
	if err := os.WriteFile(*svgPath, []byte(handoffChart(res)), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*readmePath, []byte(rep.markdown()), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "\n%s\nwrote %s and %s from %s\n", rep.targetSummary(), *readmePath, *svgPath, *from)
	if suiteErr != nil {
		log.Fatal(suiteErr)
	}
}

// runSuite builds the test binary once and runs every group, echoing the
// output, and returns it all. A group that fails does not stop the others:
// its error is returned with everything measured.
func runSuite(gs []group, pin *pinning) ([]byte, error) {
	dir, err := os.MkdirTemp("", "advisorylock-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	atInterrupt(func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "bench.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build the benchmarks: %w", err)
	}
	var all bytes.Buffer
	var failed []string
	passes := 0
	for _, g := range gs {
		passes = max(passes, g.passes)
	}
	for pass := 1; pass <= passes; pass++ {
		for _, g := range gs {
			if pass > g.passes {
				continue
			}
			fmt.Fprintf(os.Stderr, "== pass %d/%d, %s: %s\n", pass, g.passes, g.name, g.goTestCommand())
			cmd := exec.Command(bin, "-test.run", "^$", "-test.bench", g.bench, "-test.benchtime", g.benchtime,
				"-test.count", "1", "-test.benchmem", "-test.timeout", "30m")
			cmd.Stdout = io.MultiWriter(&all, os.Stderr)
			cmd.Stderr = os.Stderr
			if err := pin.run(cmd); err != nil {
				failed = append(failed, fmt.Sprintf("%s, pass %d (%v)", g.name, pass, err))
			}
		}
	}
	if failed != nil {
		return all.Bytes(), fmt.Errorf("failed: %s; see the output above", strings.Join(failed, ", "))
	}
	return all.Bytes(), nil
}
