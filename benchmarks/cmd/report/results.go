package main

import (
	"bufio"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// results holds every value of every benchmark of a run, by benchmark
// name (without the -GOMAXPROCS suffix) and unit.
type results map[string]map[string][]float64

var procSuffix = regexp.MustCompile(`-\d+$`)

// parseResults reads go test -bench output.
func parseResults(r io.Reader) results {
	res := results{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		units := res[name]
		if units == nil {
			units = map[string][]float64{}
			res[name] = units
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			units[f[i+1]] = append(units[f[i+1]], v)
		}
	}
	return res
}

// median returns the median of name's values in unit, and whether there
// were any.
func (r results) median(name, unit string) (float64, bool) {
	vs := r[name][unit]
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
