package bench

import (
	"slices"
	"time"
)

// Latencies returns, sorted, the milliseconds from each key's publish to
// its start; keys that never started are left out.
func Latencies(published, started map[string]time.Time) []float64 {
	out := make([]float64, 0, len(published))
	for k, p := range published {
		if s, ok := started[k]; ok {
			out = append(out, Ms(s.Sub(p)))
		}
	}
	slices.Sort(out)
	return out
}

// Percentile returns the nearest-rank p-th percentile of sorted (0 when it
// is empty): the smallest value with at least p% of the values at or below
// it. p 100 is the maximum.
func Percentile(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, max(0, (len(sorted)*p+99)/100-1))
	return sorted[i]
}

// Median sorts v in place and returns its nearest-rank median.
func Median(v []float64) float64 {
	slices.Sort(v)
	return Percentile(v, 50)
}

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Summary is what a latency report gives of a distribution, in ms.
type Summary struct {
	P50, P90, P99, Max float64
}

// Summarize returns the percentiles of sorted latencies.
func Summarize(sorted []float64) Summary {
	return Summary{
		P50: Percentile(sorted, 50), P90: Percentile(sorted, 90),
		P99: Percentile(sorted, 99), Max: Percentile(sorted, 100),
	}
}
