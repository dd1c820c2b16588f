package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// handoffChart draws the handoff p50 (bar) and p99 (whisker) of every
// handoff benchmark on a logarithmic time axis, fastest first.
func handoffChart(res *results) string {
	type bar struct {
		label, kind string
		p50, p99    float64 // µs
	}
	var bars []bar
	for _, row := range handoffRows {
		for _, drv := range []string{"pq", "pgx", "sqlite"} {
			name := "BenchmarkHandoff/" + row.lib + "/" + drv
			p50, ok := res.median(name, "p50-us")
			if !ok {
				continue
			}
			p99, _ := res.median(name, "p99-us")
			bars = append(bars, bar{stripMD(row.label) + " · " + drv, row.kind, p50, max(p99, p50)})
		}
	}
	slices.SortStableFunc(bars, func(a, b bar) int {
		switch {
		case a.p50 < b.p50:
			return -1
		case a.p50 > b.p50:
			return 1
		}
		return 0
	})

	const (
		width, left, right, top, rowH, axisH = 960, 330, 90, 50, 24, 50
	)
	height := top + rowH*max(len(bars), 1) + axisH
	lo, hi := 10.0, 10.0 // µs, whole decades around the data
	for _, b := range bars {
		for lo > b.p50*0.9 {
			lo /= 10
		}
		for hi < b.p99*1.1 {
			hi *= 10
		}
	}
	x := func(us float64) float64 {
		us = min(max(us, lo), hi)
		return left + (width-left-right)*(math.Log10(us)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	colors := map[string]string{"ours": "#2b6cb0", "floor": "#8a8a8a", "peer": "#dd6b20"}

	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="15" font-weight="bold">Handoff latency: holder's release → next holder acquired (log scale)</text>`+"\n", 10)
	w(`<text x="%d" y="40" fill="#444">bar: p50, whisker: p99. Blue: advisorylock; grey: raw SQL floor; orange: peers.</text>`+"\n", 10)
	axisY := top + rowH*len(bars)
	for d := lo; d <= hi*1.0001; d *= 10 {
		px := x(d)
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px, top-4, px, axisY)
		w(`<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", px, axisY+16, tick(d))
	}
	w(`<text x="%d" y="%d" text-anchor="middle" fill="#444">time from release to the next acquire</text>`+"\n", left+(width-left-right)/2, axisY+36)
	for i, b := range bars {
		y := top + rowH*i
		c := colors[b.kind]
		w(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+rowH/2+4, html.EscapeString(b.label))
		w(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y+5, x(b.p50)-left, rowH-10, c)
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5"/>`+"\n", x(b.p50), y+rowH/2, x(b.p99), y+rowH/2, c)
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5"/>`+"\n", x(b.p99), y+7, x(b.p99), y+rowH-7, c)
		w(`<text x="%.1f" y="%d" fill="#222">%s</text>`+"\n", x(b.p99)+5, y+rowH/2+4, dur(b.p50*1e3))
	}
	// The target: 3× SELECT 1, as measured by the handoff benchmarks.
	for i, drv := range []string{"pq", "pgx"} {
		if u, ok := res.median("BenchmarkHandoff/advisorylock/"+drv, "select1-p50-us"); ok {
			px := x(3 * u)
			w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#2f855a" stroke-dasharray="4 3"/>`+"\n", px, top-4, px, axisY)
			w(`<text x="%.1f" y="%d" fill="#2f855a" font-size="10">3× SELECT 1 (%s)</text>`+"\n", px+3, axisY-6-12*i, drv)
		}
	}
	w(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444"/>`+"\n", left, top-4, left, axisY)
	w("</svg>\n")
	return s.String()
}

// tick labels a decade on the axis.
func tick(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.0f s", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.0f ms", us/1e3)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}
