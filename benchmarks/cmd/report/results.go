package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The phases of a run: the suite runs with the server pinned to its own
// CPU (see pinning), and the groups that feed the gates run again
// unpinned. The report writes a "pinning: <phase>" line (a benchstat
// configuration line) before each group's output.
const (
	phasePinned   = "pinned"
	phaseUnpinned = "unpinned"
	phaseKey      = "pinning"
)

// results holds every value of every benchmark of one phase of a run, by
// benchmark name (without the -GOMAXPROCS suffix) and unit, and which
// names the report has looked up (the rest go to "Other benchmarks").
type results struct {
	vals map[string]map[string][]float64
	seen map[string]bool
}

func newResults() *results {
	return &results{vals: map[string]map[string][]float64{}, seen: map[string]bool{}}
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// parseResults reads go test -bench output, by phase. Output without
// phase lines (an older run) is all pinned.
func parseResults(r io.Reader) map[string]*results {
	phases := map[string]*results{phasePinned: newResults(), phaseUnpinned: newResults()}
	cur := phases[phasePinned]
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), phaseKey+": "); ok {
			if p := phases[strings.TrimSpace(v)]; p != nil {
				cur = p
			}
			continue
		}
		cur.add(sc.Text())
	}
	return phases
}

// add records one line of benchmark output, if it is one.
func (r *results) add(line string) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return
	}
	name := procSuffix.ReplaceAllString(f[0], "")
	units := r.vals[name]
	if units == nil {
		units = map[string][]float64{}
		r.vals[name] = units
	}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			break
		}
		units[f[i+1]] = append(units[f[i+1]], v)
	}
}

// empty reports whether the phase measured nothing.
func (r *results) empty() bool { return len(r.vals) == 0 }

// median returns the median of name's values in unit, and whether there
// were any; it marks name as shown.
func (r *results) median(name, unit string) (float64, bool) {
	r.seen[name] = true
	vs := r.vals[name][unit]
	if len(vs) == 0 {
		return 0, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2], true
	}
	return (s[n/2-1] + s[n/2]) / 2, true
}

// spread describes the range of name's values in unit when there are
// several (one a pass): " (1.02–1.13× over 5 passes)".
func (r *results) spread(name, unit string) string {
	vs := r.vals[name][unit]
	if len(vs) < 2 {
		return ""
	}
	return fmt.Sprintf(" (%.2f–%.2f× over %d passes)", slices.Min(vs), slices.Max(vs), len(vs))
}

// unseen returns the names the report has not looked up, sorted.
func (r *results) unseen() []string {
	var out []string
	for name := range r.vals {
		if !r.seen[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// matching returns the names that contain sub (case-insensitive), sorted.
func (r *results) matching(sub string) []string {
	var out []string
	for name := range r.vals {
		if strings.Contains(strings.ToLower(name), sub) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// units returns the units measured for name, sorted.
func (r *results) units(name string) []string {
	var out []string
	for u := range r.vals[name] {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// parseMeta reads the "report-…: value" lines the report saves with the
// output (benchstat shows them as configuration).
func parseMeta(raw []byte) map[string]string {
	meta := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && strings.HasPrefix(k, "report-") && !strings.Contains(k, " ") {
			meta[k] = strings.TrimSpace(v)
		}
	}
	return meta
}
