// Package standby is a worker's stand-by before it claims a task: its
// rank of the task among the live workers able to run it (rendezvous
// ranking, preempt.Peers), cached per task key, times the claim spread's
// step, the step stretched to outlast the change stream's lag.
package standby

import (
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// Ranker owns one worker's ranks and the lag it measured. It belongs to
// the scheduler's goroutine and takes no lock.
type Ranker struct {
	self   string
	spread preempt.Spread
	// peers is the registry's live workers as last read (written by the
	// heartbeat); ranks caches this worker's rank of unpinned tasks under
	// ranksOf, and is cleared past room keys.
	peers   *atomic.Pointer[preempt.Peers]
	room    int
	ranks   map[string]int
	ranksOf *preempt.Peers
	// lags is the latest times from a write to its change event reaching
	// this worker (see NoteLag), whose slow tail the stand-by step must
	// outlast twice.
	lags preempt.EventLags
}

// New returns the Ranker of worker self, spreading by spread among
// peers, its cache of ranks cleared past room keys.
func New(self string, spread preempt.Spread, peers *atomic.Pointer[preempt.Peers], room int) *Ranker {
	return &Ranker{self: self, spread: spread, peers: peers, room: room, ranks: map[string]int{}}
}

// Spreading reports whether claims are spread (a step is set).
func (r *Ranker) Spreading() bool { return r.spread.Step > 0 }

// Delay is how long this worker waits, past the moment t becomes
// claimable, before it tries to claim t: none when it is t's preferred
// worker among the live workers able to run t, a step more for each rank
// after (preempt.Spread). A claim that lands is a change event that
// reaches the others before their turn, so they never try; one that does
// not (the preferred worker busy, dead or slow) leaves the task to the
// next rank a step later, and to every worker after MaxRank steps.
func (r *Ranker) Delay(t *task.Task, now time.Time) time.Duration {
	if r.spread.Step <= 0 {
		return 0
	}
	peers := r.peers.Load()
	if peers.Len() <= 1 {
		return 0
	}
	if peers != r.ranksOf {
		if !peers.SameRanking(r.ranksOf) {
			clear(r.ranks)
		}
		r.ranksOf = peers
	}
	if len(r.ranks) > r.room {
		clear(r.ranks)
	}
	rank, ok := r.ranks[t.Key]
	if !ok || len(t.SpecificWorkerIDs) > 0 {
		rank = peers.Rank(t, r.self, r.spread.MaxRank)
		if len(t.SpecificWorkerIDs) == 0 {
			r.ranks[t.Key] = rank
		}
	}
	// A task run by several workers at once has a first place for each
	// of its free slots.
	if free := t.ConcurrentWorkerCnt - t.CountWorkers(now).Live; free > 1 {
		rank = max(rank-(free-1), 0)
	}
	return r.spread.Stretched(r.lags.High(), maxSpreadStep).Delay(rank)
}

// maxSpreadStep bounds the stand-by step however slow the change stream
// is, so that a task whose preferred workers are busy or dead waits at
// most a second (ten ranks) for the others.
const maxSpreadStep = 100 * time.Millisecond

// NoteLag notes the lag of change event ev, from its write to now. A
// stand-by step is only useful if it outlasts two of them: the preferred
// worker hears of the task one lag after it became claimable, and the
// next rank hears of its claim one write and one lag after that; on a
// store whose events come slower than the configured step (a remote
// MongoDB polled by its driver, say), the next rank would otherwise try
// before it hears the claim, and conflict (preempt.EventLags). Events
// older than a second are a stream catching up, not its lag.
func (r *Ranker) NoteLag(ev task.Event, now time.Time) {
	at, ok := preempt.WrittenAt(ev.Task, ev.Version)
	if !ok {
		return
	}
	lag := now.Sub(at)
	if lag < 0 || lag > time.Second {
		return
	}
	r.lags.Note(lag)
}
