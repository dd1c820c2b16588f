// Command report runs the advisorylock benchmark suite, summarizes it with
// benchstat, and writes README.md (the performance gates met or not, the
// handoff against the peers, the machine and versions, the exact
// commands; a part written by hand after its marker is kept), details.md
// (every other table: figures as ratios to SELECT 1 and to the best peer)
// and handoff.svg (handoff latency by library). Run it inside benchmarks/:
//
//	go run ./cmd/report           # full: 5 passes, pinned then unpinned, about 10 minutes on 2 cores
//	go run ./cmd/report -quick    # one short pass, for development
//	go run ./cmd/report -from results.txt   # rewrite the report from saved output
//
// The PostgreSQL server is ADVISORYLOCK_TEST_POSTGRES, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
package main

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	unpinned  bool // also run with nothing pinned, right after the pinned run
}

// knownBenchmarks are the top-level benchmarks the groups below run by
// name; any other Benchmark function of the package runs in the group
// "other benchmarks" (see otherGroup).
var knownBenchmarks = []string{"BenchmarkPG", "BenchmarkSQLite", "BenchmarkPaired", "BenchmarkRoundTrips",
	"BenchmarkHandoff", "BenchmarkHandoffPaired", "BenchmarkLeaseHandoffPaired", "BenchmarkScaling", "BenchmarkMySQLPaired", "BenchmarkMySQLHandoffPaired", "BenchmarkPeers", "BenchmarkPeersPinnedFloor", "BenchmarkMissCost"}

// groups returns the suite; other, when not "", is the -bench expression
// of the benchmarks no group names (see otherGroup). The full run takes
// about 12 minutes on 2 shared cores; quick about two.
func groups(quick bool, count int, other string) []group {
	gs := []group{
		{"uncontended ops", `^Benchmark(PG|SQLite)$`, "300ms", count, true},
		{"paired ratios", `^BenchmarkPaired$`, "300x", count, true},
		{"round trips", `^BenchmarkRoundTrips$`, "200x", 1, false},
		{"handoff, paired with the bare handoff", `^BenchmarkHandoffPaired$`, "300x", count, true},
		{"lease handoff, paired with the Lock's", `^BenchmarkLeaseHandoffPaired$`, "200x", count, true},
		{"handoff, server-side waits", `^BenchmarkHandoff$/^(advisorylock|raw_blocking|raw_literal|migrate)$`, "300x", count, false},
		{"handoff, 20ms pollers", `^BenchmarkHandoff$/^(leaselock|leaselock_held50ms|leaselock_held200ms|goose_table|sqlite_raw|sqlite_lock|sqlite_leaselock)$`, "40x", count, false},
		{"handoff, goose session locker (1s)", `^BenchmarkHandoff$/^goose_session$`, "6x", min(count, 3), false},
		{"scaling", `^BenchmarkScaling$`, "300ms", min(count, 3), false},
		{"MySQL paired ratios", `^(BenchmarkMySQLPaired|BenchmarkMySQLHandoffPaired)$`, "300ms", count, true},
		{"miss cost", `^BenchmarkMissCost$`, "400x", count, true},
	}
	gs = append(gs, peerGroups(count)...)
	if other != "" {
		gs = append(gs, group{"other benchmarks", other, "300ms", count, false})
	}
	if quick {
		short := map[string]string{"300ms": "100ms", "300x": "100x", "400x": "100x", "200x": "20x", "40x": "10x", "6x": "3x"}
		for i := range gs {
			gs[i].benchtime = cmp.Or(short[gs[i].benchtime], gs[i].benchtime)
			gs[i].passes = 1
		}
	}
	return gs
}

// otherGroup lists the test binary's benchmarks and returns a -bench
// expression for those no group names (the observer's, MySQL's, …), or
// "" when there are none.
func otherGroup(bin string) (string, error) {
	out, err := exec.Command(bin, "-test.list", "^Benchmark").Output()
	if err != nil {
		return "", fmt.Errorf("list the benchmarks: %w", err)
	}
	var names []string
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, "Benchmark") && !slices.Contains(knownBenchmarks, name) {
			names = append(names, regexp.QuoteMeta(name))
		}
	}
	if names == nil {
		return "", nil
	}
	return "^(" + strings.Join(names, "|") + ")$", nil
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
	readmePath := flag.String("readme", "README.md", "where to write the report (its part after the hand-written marker is kept)")
	detailsPath := flag.String("details", "details.md", "where to write every other table")
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
	var other string // the -bench expression of the "other benchmarks" group
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
		other = meta["report-other"]
		if t, err := time.Parse(time.RFC3339, meta["report-started"]); err == nil {
			m.Started = t
		}
		if d, err := time.ParseDuration(meta["report-took"]); err == nil {
			m.Took = d
		}
		m.LoadBefore = cmp.Or(meta["report-load-before"], "unknown")
		m.LoadAfter = cmp.Or(meta["report-load-after"], "unknown")
		m.Pinning = cmp.Or(meta["report-pinning"], "not recorded")
		m.CPUModel = cmp.Or(meta["report-cpu"], m.CPUModel+" (today's machine: the measured one was not saved)")
		m.Commit = cmp.Or(meta["report-commit"], m.Commit+" (today's checkout: the measured commit was not saved)")
	} else {
		var all bytes.Buffer
		fmt.Fprintf(&all, "report-command: %s\nreport-quick: %t\nreport-count: %d\nreport-started: %s\nreport-load-before: %s\nreport-commit: %s\nreport-cpu: %s\n",
			cmdline, *quick, *count, m.Started.Format(time.RFC3339), m.LoadBefore, m.Commit, m.CPUModel)
		pin := pinServer(dsn)
		m.Pinning = pin.desc
		fmt.Fprintf(&all, "report-pinning: %s\n", pin.desc)
		out, err := runSuite(*quick, *count, pin, &all)
		pin.restore()
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
		other = parseMeta(raw)["report-other"]
	}
	gs := groups(*quick, *count, other)

	stat, err := exec.Command("go", "tool", "benchstat", *from).CombinedOutput()
	if err != nil {
		log.Fatalf("benchstat: %v\n%s", err, stat)
	}
	phases := parseResults(bytes.NewReader(raw))
	rep := newReport(phases, m, gs, cmdline, string(stat), *from, filepath.Base(*svgPath), suiteErr)
	if err := os.WriteFile(*svgPath, []byte(handoffChart(rep.res)), 0o644); err != nil {
		log.Fatal(err)
	}
	hand, err := handWritten(*readmePath)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*readmePath, []byte(rep.markdown(filepath.Base(*detailsPath), hand)), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*detailsPath, []byte(rep.detailsMarkdown(filepath.Base(*readmePath))), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "\n%s\nwrote %s, %s and %s from %s\n", rep.targetSummary(), *readmePath, *detailsPath, *svgPath, *from)
	if suiteErr != nil {
		log.Fatal(suiteErr)
	}
}

// handWritten returns the part of the README at path from handMarker on,
// "" if it has none or does not exist yet.
func handWritten(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	_, hand, ok := strings.Cut(string(b), handMarker)
	if !ok {
		return "", nil
	}
	return handMarker + hand, nil
}

// runSuite builds the test binary once and runs every group, echoing the
// output, into all (after a "report-other" line naming the benchmarks no
// group names). Each group runs pinned and, if it asks, then unpinned,
// after a "pinning: <phase>" line. A group that fails does not stop the
// others: its error is returned with everything measured. It returns
// nil output only when nothing could run.
func runSuite(quick bool, count int, pin *pinning, all *bytes.Buffer) ([]byte, error) {
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
	other, err := otherGroup(bin)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(all, "report-other: %s\n", other)
	gs := groups(quick, count, other)
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
			for _, phase := range pin.phases(g) {
				fmt.Fprintf(os.Stderr, "== pass %d/%d, %s, %s: %s\n", pass, g.passes, g.name, phase, g.goTestCommand())
				fmt.Fprintf(all, "%s: %s\n", phaseKey, phase)
				cmd := exec.Command(bin, "-test.run", "^$", "-test.bench", g.bench, "-test.benchtime", g.benchtime,
					"-test.count", "1", "-test.benchmem", "-test.timeout", "30m")
				cmd.Stdout = io.MultiWriter(all, os.Stderr)
				cmd.Stderr = os.Stderr
				if err := pin.run(cmd, phase); err != nil {
					failed = append(failed, fmt.Sprintf("%s, pass %d, %s (%v)", g.name, pass, phase, err))
				}
			}
		}
	}
	if failed != nil {
		return all.Bytes(), fmt.Errorf("failed: %s; see the output above", strings.Join(failed, ", "))
	}
	return all.Bytes(), nil
}
