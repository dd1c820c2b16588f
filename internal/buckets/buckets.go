// Package buckets holds the histogram bucket boundaries that the metric
// adapters (extra/advisorylockotel, extra/advisorylockprom) share, so
// that both export the same histograms.
package buckets

// Durations returns the bucket boundaries, in seconds, of the duration
// histograms: from 100µs to 60s, for waits and holds from a local round
// trip to a minute. (OpenTelemetry's default boundaries are sized for
// milliseconds.) Each call returns a new slice.
func Durations() []float64 {
	return []float64{
		0.0001, 0.00025, 0.0005,
		0.001, 0.0025, 0.005,
		0.01, 0.025, 0.05,
		0.1, 0.25, 0.5,
		1, 2.5, 5, 10, 30, 60,
	}
}
