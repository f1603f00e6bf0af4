// Package stats keeps the dashboard's time series: how many attempts of
// each kind ended in each outcome per minute and per quarter hour, and a
// sample of the queue (pending tasks, the oldest ready task's wait) per
// bucket. The workers write them as they finish tasks (Recorder, a
// consumer.Observer), as task.Document values merged by compare-and-set,
// so every store keeps them without a table of its own and any number of
// workers add to one bucket without losing a count. Read returns them for
// a chart.
package stats

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The namespaces of the buckets: one document per minute and one per
// quarter hour, named by the bucket's start (BucketID).
const (
	MinuteNamespace  = "leasepool.stats.minute"
	QuarterNamespace = "leasepool.stats.quarter"
)

// How long buckets are kept: a little more than the longest chart of each
// resolution (the last hour, the last day) shows.
const (
	KeepMinutes  = 2 * time.Hour
	KeepQuarters = 26 * time.Hour
)

// MaxKinds bounds the kinds one bucket counts separately; the counts of
// further kinds go to OtherKinds, so that a flood of distinct kinds cannot
// grow a bucket past task.MaxDocumentSize.
const MaxKinds = 200

// OtherKinds is the key of the counts of kinds past MaxKinds. No kind has
// it: kind names must not be empty.
const OtherKinds = ""

// Counts are the attempts of one kind that ended in each outcome, as the
// workers wrote them.
type Counts struct {
	// Succeeded: success written.
	Succeeded int64 `json:"succeeded,omitempty"`
	// Failed: failure written with no retry left; the task is failed.
	Failed int64 `json:"failed,omitempty"`
	// Retried: failure written; the task runs again.
	Retried int64 `json:"retried,omitempty"`
	// Cancelled: an operator cancelled the task while it ran.
	Cancelled int64 `json:"cancelled,omitempty"`
	// Expired: a holder's lease ran out (crashed or frozen) and another
	// worker's claim recorded the attempt as failed.
	Expired int64 `json:"expired,omitempty"`
}

// Finished is Succeeded + Failed: the tasks that ended in the bucket.
func (c Counts) Finished() int64 { return c.Succeeded + c.Failed }

// Total is every attempt counted.
func (c Counts) Total() int64 { return c.Succeeded + c.Failed + c.Retried + c.Cancelled + c.Expired }

func (c *Counts) add(o Counts) {
	c.Succeeded += o.Succeeded
	c.Failed += o.Failed
	c.Retried += o.Retried
	c.Cancelled += o.Cancelled
	c.Expired += o.Expired
}

// Queue is a sample of the queue.
type Queue struct {
	// At is the store time of the sample.
	At time.Time `json:"at"`
	// Pending is how many tasks were pending (ready or waiting for their
	// run_at or a retry).
	Pending int64 `json:"pending"`
	// OldestReady is how long the longest-waiting ready task had been
	// claimable; zero when none was ready.
	OldestReady task.Duration `json:"oldest_ready,omitempty"`
}

// Bucket is one minute's or quarter hour's document.
type Bucket struct {
	Start time.Time `json:"start"`
	// Kinds are the counts by kind (OtherKinds past MaxKinds).
	Kinds map[string]Counts `json:"kinds,omitempty"`
	// Queue is the queue sampled in the bucket: a minute's first sample,
	// a quarter's largest (most pending, longest wait) of its minutes'.
	Queue *Queue `json:"queue,omitempty"`
	// Flushes holds, per recorder, the sequence number of its last flush
	// applied here: a flush whose write failed without knowing whether it
	// landed is applied again only if it did not.
	Flushes map[string]int64 `json:"flushes,omitempty"`
}

// Sum is the bucket's counts over every kind.
func (b Bucket) Sum() Counts {
	var c Counts
	for _, k := range b.Kinds {
		c.add(k)
	}
	return c
}

// Resolution is a bucket size with its namespace.
type Resolution struct {
	Namespace string
	Step      time.Duration
	Keep      time.Duration
}

// The two resolutions kept.
var (
	Minute  = Resolution{MinuteNamespace, time.Minute, KeepMinutes}
	Quarter = Resolution{QuarterNamespace, 15 * time.Minute, KeepQuarters}
)

// BucketID is the document id of the bucket holding t: its start in UTC,
// "2006-01-02T15:04Z", which sorts as time does.
func (r Resolution) BucketID(t time.Time) string {
	return r.start(t).Format(idLayout)
}

const idLayout = "2006-01-02T15:04Z"

func (r Resolution) start(t time.Time) time.Time { return t.UTC().Truncate(r.Step) }

// merge adds d to b (b.Queue by the resolution's rule).
func (r Resolution) merge(b *Bucket, d *delta) {
	for kind, c := range d.kinds {
		if b.Kinds == nil {
			b.Kinds = map[string]Counts{}
		}
		if _, ok := b.Kinds[kind]; !ok && len(b.Kinds) >= MaxKinds {
			kind = OtherKinds
		}
		cur := b.Kinds[kind]
		cur.add(c)
		b.Kinds[kind] = cur
	}
	if q := d.queue; q != nil {
		switch {
		case b.Queue == nil:
			b.Queue = q
		case r.Step > time.Minute:
			at := b.Queue.At
			if q.At.After(at) {
				at = q.At
			}
			b.Queue = &Queue{At: at, Pending: max(b.Queue.Pending, q.Pending), OldestReady: max(b.Queue.OldestReady, q.OldestReady)}
		}
	}
}

// Series is the buckets of one resolution over a span, one per step,
// oldest first, empty steps included.
type Series struct {
	Step    time.Duration
	Buckets []Bucket
	// Kinds are the kinds with a count in the span, most attempts first.
	Kinds []string
}

// Sum is the counts of kind over the series; every kind's for "*".
func (s Series) Sum(kind string) Counts {
	var c Counts
	for _, b := range s.Buckets {
		if kind == "*" {
			c.add(b.Sum())
		} else {
			c.add(b.Kinds[kind])
		}
	}
	return c
}

// Read returns the n buckets of resolution r that end with the one
// holding now. It reads the resolution's whole namespace, which pruning
// keeps to about r.Keep.
func Read(ctx context.Context, s task.DocumentStore, r Resolution, now time.Time, n int) (Series, error) {
	if n <= 0 {
		return Series{}, fmt.Errorf("stats: %w: buckets: must be positive, got %d", task.ErrInvalid, n)
	}
	docs, err := s.Documents(ctx, r.Namespace)
	if err != nil {
		return Series{}, fmt.Errorf("stats: %w", err)
	}
	last := r.start(now)
	first := last.Add(-time.Duration(n-1) * r.Step)
	out := Series{Step: r.Step, Buckets: make([]Bucket, n)}
	for i := range out.Buckets {
		out.Buckets[i].Start = first.Add(time.Duration(i) * r.Step)
	}
	totals := map[string]int64{}
	for _, d := range docs {
		b, err := decode(d)
		if err != nil {
			continue // not ours to judge: a bucket written by a newer version
		}
		i := int(b.Start.Sub(first) / r.Step)
		if b.Start.Before(first) || i >= n || !out.Buckets[i].Start.Equal(b.Start) {
			continue
		}
		b.Flushes = nil
		out.Buckets[i] = b
		for k, c := range b.Kinds {
			totals[k] += c.Total()
		}
	}
	out.Kinds = slices.Collect(maps.Keys(totals))
	slices.SortFunc(out.Kinds, func(a, b string) int {
		return cmp.Or(cmp.Compare(totals[b], totals[a]), cmp.Compare(a, b))
	})
	return out, nil
}

func decode(d task.Document) (Bucket, error) {
	var b Bucket
	if err := json.Unmarshal(d.Value, &b); err != nil {
		return Bucket{}, err
	}
	if b.Start.IsZero() {
		return Bucket{}, errors.New("no start")
	}
	b.Start = b.Start.UTC()
	return b, nil
}
