package preempt

// The stand-by step a worker's change stream calls for. The worker of rank
// 1 must hear of the preferred worker's claim before its own turn: by then
// the task's write has reached the preferred worker (one event lag), its
// claim has been written and has reached the worker of rank 1 (a second
// lag, the claim's write included, since a write is stamped before it is
// sent). On a store whose events come late and unevenly (MongoDB's change
// stream, polled) the step must outlast two lags of the slow tail, not two
// of the mean: a step drawn from the mean let the next rank try before it
// heard the claim for about one task in five at 8 processes on the wire
// test server.

import (
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// EventLags is the latest change-event lags one worker measured, each
// from a write to its event reaching the worker, and the high quantile of
// them that sets its stand-by step. The zero value is ready; it is not
// safe for concurrent use.
type EventLags struct {
	ring [LagWindow]time.Duration
	n    int // samples held, up to LagWindow
	next int // where the next sample goes
	// high is the window's LagQuantile, computed again every lagRecompute
	// samples (a sort of the window) rather than at every stand-by.
	high      time.Duration
	sinceHigh int
}

const (
	// LagWindow is how many of the latest lags the quantile is taken
	// over: enough for the 99th percentile to stand on five or so slow
	// events rather than on one (128 lags let through ten times the
	// early tries in TestStandByOutlastsTwoLags), and a couple of seconds
	// of events on a worker hearing 100 tasks a second, so that the step
	// follows a stream that slows down or recovers within that.
	LagWindow = 512
	// LagQuantile is the lag quantile the step covers twice.
	LagQuantile  = 0.99
	lagRecompute = 16
	// MinLags is how many lags a worker notes before it goes by them:
	// about ten tasks' events.
	MinLags = 32
	// UnknownLag is High's answer before MinLags lags: longer than any
	// step's limit.
	UnknownLag = time.Hour
)

// Note adds the lag of one event.
func (l *EventLags) Note(lag time.Duration) {
	l.ring[l.next] = lag
	l.next = (l.next + 1) % LagWindow
	l.n = min(l.n+1, LagWindow)
	if l.sinceHigh++; l.sinceHigh >= lagRecompute || l.n <= MinLags {
		l.high, l.sinceHigh = l.quantile(LagQuantile), 0
	}
}

// High is the LagQuantile of the lags noted (as of at most lagRecompute
// samples ago), or UnknownLag while fewer than MinLags were: a worker
// that has not yet heard its stream for long stands by the longest step.
// Its first events are often its slowest (connections, and a server's
// caches, warming up), and too few to tell a tail from.
func (l *EventLags) High() time.Duration {
	if l.n < MinLags {
		return UnknownLag
	}
	return l.high
}

func (l *EventLags) quantile(q float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	s := slices.Clone(l.ring[:l.n])
	slices.Sort(s)
	return s[int(q*float64(l.n-1)+0.5)]
}

// Stretched is s with its step at least twice high, the high quantile of
// the worker's event lags (EventLags.High), but at most limit: a step
// shorter than two lags has the next rank try before it hears the
// preferred worker's claim, and conflict. Limit bounds the wait a task
// whose preferred workers are busy or dead pays however slow the stream.
func (s Spread) Stretched(high, limit time.Duration) Spread {
	if high > limit/2 {
		high = limit / 2 // and no overflow doubling UnknownLag
	}
	s.Step = max(s.Step, min(2*high, limit))
	return s
}

// WrittenAt is when t's write of version was made, by the store clock of
// the process that wrote it, as far as t tells: a change event may carry
// a later write's document (MongoDB looks it up when the event is read),
// whose UpdatedAt would make a slow event look fast. The claims and the
// publish (version 1) say when they were written; other past writes are
// unknown (ok false). A version of 0 is taken as t's own.
func WrittenAt(t *task.Task, version int64) (at time.Time, ok bool) {
	switch {
	case version == 0 || version == t.Version:
		return t.UpdatedAt, !t.UpdatedAt.IsZero()
	case version == 1:
		return t.CreatedAt, !t.CreatedAt.IsZero()
	}
	for _, a := range t.Attempts {
		if a.ClaimVersion == version {
			return a.StartedAt, !a.StartedAt.IsZero()
		}
	}
	return time.Time{}, false
}
