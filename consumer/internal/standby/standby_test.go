package standby

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

func peersOf(now time.Time, ids ...string) *preempt.Peers {
	var ws []task.WorkerInfo
	for _, id := range ids {
		ws = append(ws, task.WorkerInfo{ID: id, Instance: "i", Concurrency: 1, Heartbeat: now, Until: now.Add(time.Minute)})
	}
	return preempt.NewPeers(ws, ws[0], now)
}

// pending is a task of seq (which ranks it: task.ShareBucket).
func pending(seq int) *task.Task {
	return &task.Task{Key: fmt.Sprintf("t%d", seq), Seq: int64(seq), Kind: "k", State: task.StatePending, ConcurrentWorkerCnt: 1, SuccessWorkerCnt: 1}
}

// TestDelayByRankAndLag: alone, a worker never stands by; among two, it
// stands by a step for the tasks it ranks second for and none for the
// others; a change stream slower than the step stretches the step to
// outlast two lags of its slow tail, never past maxSpreadStep.
func TestDelayByRankAndLag(t *testing.T) {
	now := time.Now()
	step := 5 * time.Millisecond
	var peers atomic.Pointer[preempt.Peers]
	peers.Store(peersOf(now, "a"))
	r := New("a", preempt.Spread{Step: step, MaxRank: 10}, &peers, 100)
	if d := r.Delay(pending(0), now); d != 0 {
		t.Fatalf("alone, a worker stands by %v", d)
	}
	peers.Store(peersOf(now, "a", "b"))
	first, second := -1, -1
	for i := 1; i < 10000 && (first < 0 || second < 0); i++ {
		switch peers.Load().Rank(pending(i), "a", 10) {
		case 0:
			first = i
		case 1:
			second = i
		}
	}
	if first < 0 || second < 0 {
		t.Fatal("no task of each rank among two workers")
	}
	if d := r.Delay(pending(first), now); d != 0 {
		t.Fatalf("the preferred worker stands by %v", d)
	}
	if d := r.Delay(pending(second), now); d != maxSpreadStep {
		t.Fatalf("before it knows its stream's lag the second rank stands by %v; want the bound %v", d, maxSpreadStep)
	}
	lagged := pending(1)
	lagged.Version = 2
	note := func(lag time.Duration, n int) {
		for range n {
			lagged.UpdatedAt = now.Add(-lag)
			r.NoteLag(task.Event{Task: lagged, Version: lagged.Version}, now)
		}
	}
	note(time.Millisecond, preempt.MinLags)
	if d := r.Delay(pending(second), now); d != step {
		t.Fatalf("on a fast stream the second rank stands by %v; want the step %v", d, step)
	}
	note(20*time.Millisecond, preempt.LagWindow)
	if d := r.Delay(pending(second), now); d != 40*time.Millisecond {
		t.Fatalf("after 20ms lags the second rank stands by %v; want two lags", d)
	}
	note(900*time.Millisecond, preempt.LagWindow)
	if d := r.Delay(pending(second), now); d != maxSpreadStep {
		t.Fatalf("on a slow stream the second rank stands by %v; want the bound %v", d, maxSpreadStep)
	}
	before := r.lags
	note(time.Hour, 1)
	if r.lags != before {
		t.Fatal("an event an hour old was noted as a lag")
	}
}

// TestRanksFollowTheLiveWorkers: a rank cached under one set of workers
// is not used once the ranking changes (a worker came), and the cache
// never outgrows its room.
func TestRanksFollowTheLiveWorkers(t *testing.T) {
	now := time.Now()
	var peers atomic.Pointer[preempt.Peers]
	peers.Store(peersOf(now, "a", "b"))
	r := New("a", preempt.Spread{Step: time.Millisecond, MaxRank: 10}, &peers, 8)
	for range preempt.MinLags { // a fast stream: the step is the configured one
		r.NoteLag(task.Event{Task: &task.Task{Version: 1, UpdatedAt: now}}, now)
	}
	for i := range 20 {
		r.Delay(pending(i), now)
		if len(r.ranks) > 9 {
			t.Fatalf("%d ranks cached; room 8", len(r.ranks))
		}
	}
	// Find a task "a" ranks first for among a and b but not among a, b,
	// c, d: its cached rank must not outlive the workers' arrival.
	key := -1
	more := peersOf(now, "a", "b", "c", "d")
	for i := 100; i < 10000 && key < 0; i++ {
		if peers.Load().Rank(pending(i), "a", 10) == 0 && more.Rank(pending(i), "a", 10) > 0 {
			key = i
		}
	}
	if key < 0 {
		t.Fatal("no task whose rank two more workers change")
	}
	if d := r.Delay(pending(key), now); d != 0 {
		t.Fatalf("preferred among two, stands by %v", d)
	}
	peers.Store(more)
	want := time.Duration(more.Rank(pending(key), "a", 10)) * time.Millisecond
	if d := r.Delay(pending(key), now); d != want {
		t.Fatalf("after two workers came, stands by %v; want %v", d, want)
	}
}
