package web

// The overview's charts read from the buckets the workers keep (package
// stats): a few dozen small documents, whatever the throughput.

import (
	"context"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/internal/stats"
)

// chartRange is a span the overview charts: its resolution and how many
// buckets of it.
type chartRange struct {
	Name    string
	Label   string
	res     stats.Resolution
	buckets int
}

var chartRanges = []chartRange{
	{"hour", "last hour, per minute", stats.Minute, 60},
	{"day", "last day, per 15 minutes", stats.Quarter, 96},
}

// maxKindCharts bounds the per-kind charts the overview draws, the kinds
// with the most attempts first.
const maxKindCharts = 12

// overviewCharts are the overview's charts.
type overviewCharts struct {
	Range  chartRange
	Ranges []chartRange
	// All is every kind's throughput (AllNarrow drawn for a phone's
	// width), Totals its sums.
	All, AllNarrow template.HTML
	Totals         stats.Counts
	Kinds          []kindChart
	// MoreKinds is how many kinds with attempts in the range have no chart.
	MoreKinds   int
	Pending     template.HTML
	OldestReady template.HTML
	// Empty says no worker recorded anything in the range.
	Empty bool
}

// kindChart is one kind's throughput chart.
type kindChart struct {
	Kind   string
	Name   string
	Chart  template.HTML
	Counts stats.Counts
}

// parseRange reads ?range=, "hour" by default.
func parseRange(q url.Values) (chartRange, error) {
	name := q.Get("range")
	if name == "" {
		return chartRanges[0], nil
	}
	for _, r := range chartRanges {
		if r.Name == name {
			return r, nil
		}
	}
	return chartRange{}, badInput("range", "must be hour or day, got %q", name)
}

func (d *dashboard) readCharts(ctx context.Context, rg chartRange) (*overviewCharts, error) {
	s, err := stats.Read(ctx, d.store, rg.res, d.store.Now(), rg.buckets)
	if err != nil {
		return nil, err
	}
	c := &overviewCharts{Range: rg, Ranges: chartRanges, Totals: s.Sum("*"), All: throughputChart("chart-all", "*", s, wideChart)}
	c.AllNarrow = throughputChart("chart-all-narrow", "*", s, smallChart)
	c.Empty = len(s.Kinds) == 0
	for i, kind := range s.Kinds {
		if i == maxKindCharts {
			c.MoreKinds = len(s.Kinds) - i
			break
		}
		name := kind
		if kind == stats.OtherKinds {
			name = "other kinds"
		}
		c.Kinds = append(c.Kinds, kindChart{Kind: kind, Name: name, Counts: s.Sum(kind),
			Chart: throughputChart("chart-kind-"+strconv.Itoa(i), kind, s, smallChart)})
	}
	c.Pending = queueChart("chart-pending", "pending tasks", s,
		func(q stats.Queue) float64 { return float64(q.Pending) }, num)
	c.OldestReady = queueChart("chart-oldest-ready", "oldest ready task's wait", s,
		func(q stats.Queue) float64 { return durationSeconds(q) }, secondsLabel)
	return c, nil
}

// durationSeconds is the oldest ready task's wait in seconds.
func durationSeconds(q stats.Queue) float64 {
	return time.Duration(q.OldestReady).Seconds()
}

// rangeURL is the overview's address for range name.
func rangeURL(name string) string { return fmt.Sprintf("/?range=%s#charts", url.QueryEscape(name)) }
