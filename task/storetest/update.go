// update.go attacks Update under concurrency: stores may send concurrent
// compare-and-set writes together (SQLite's group commit, MongoDB's bulk
// write), and every caller must still get its own outcome.

package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// concurrentMixed starts, all at once and for several rounds, writers of
// one version of one key (exactly one may win), a writer of a stale version,
// a writer of a missing key and writers of their own keys. A false success
// shows as two winners or as a stored document that is not the winner's; a
// resurrection as the missing key being there afterwards.
func (s suite) concurrentMixed(t *testing.T) {
	st := s.store(t)
	const rounds, rivals, own = 10, 8, 6
	for _, key := range []string{"rival", "stale"} {
		mustInsert(t, st, newTask(t, key, "k", st.Now(), task.Options{}))
	}
	for i := range own {
		mustInsert(t, st, newTask(t, fmt.Sprintf("own-%d", i), "k", st.Now(), task.Options{}))
	}
	for round := range rounds {
		var writes []*task.Task
		base := mustGet(t, st, "rival")
		for i := range rivals {
			w := base.Clone()
			w.Priority = round*100 + i + 1
			writes = append(writes, w)
		}
		stale := mustGet(t, st, "stale")
		mustModify(t, st, "stale", func(tk *task.Task) error { tk.Priority = -round; return nil })
		stale.Priority = 1000
		writes = append(writes, stale, newTask(t, "missing", "k", st.Now(), task.Options{}))
		for i := range own {
			w := mustGet(t, st, fmt.Sprintf("own-%d", i))
			w.Priority = round + 1
			writes = append(writes, w)
		}
		errs := updateAtOnce(st, writes)
		checkRound(t, st, round, writes, errs, rivals, own)
		if t.Failed() {
			return
		}
	}
}

// updateAtOnce runs one Update per write, released together.
func updateAtOnce(st task.Store, writes []*task.Task) []error {
	errs := make([]error, len(writes))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() {
			<-start
			errs[i] = st.Update(context.Background(), w)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func checkRound(t *testing.T, st task.Store, round int, writes []*task.Task, errs []error, rivals, own int) {
	t.Helper()
	winner := -1
	for i := range rivals {
		switch {
		case errs[i] == nil && winner >= 0:
			t.Errorf("round %d: rivals %d and %d of one version both succeeded", round, winner, i)
		case errs[i] == nil:
			winner = i
		case !errors.Is(errs[i], task.ErrConflict):
			t.Errorf("round %d: losing rival: %v; want ErrConflict", round, errs[i])
		}
	}
	if winner < 0 {
		t.Fatalf("round %d: no rival succeeded", round)
	}
	if got := mustGet(t, st, "rival"); got.Priority != writes[winner].Priority || got.Version != writes[winner].Version {
		t.Errorf("round %d: rival stored priority %d version %d; want the winner's %d, %d",
			round, got.Priority, got.Version, writes[winner].Priority, writes[winner].Version)
	}
	if err := errs[rivals]; !errors.Is(err, task.ErrConflict) {
		t.Errorf("round %d: stale version: %v; want ErrConflict", round, err)
	}
	if got := mustGet(t, st, "stale"); got.Priority != -round {
		t.Errorf("round %d: stale write applied: priority %d; want %d", round, got.Priority, -round)
	}
	if err := errs[rivals+1]; !errors.Is(err, task.ErrNotFound) && !errors.Is(err, task.ErrConflict) {
		t.Errorf("round %d: missing key: %v; want ErrNotFound or ErrConflict", round, err)
	}
	if _, err := st.Get(ctxFor(t), "missing"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("round %d: Get of the missing key after Update: %v; want ErrNotFound", round, err)
	}
	for i := range own {
		w, err := writes[rivals+2+i], errs[rivals+2+i]
		if got := mustGet(t, st, w.Key); err != nil || got.Version != w.Version || got.Priority != round+1 {
			t.Errorf("round %d: %s: %v, stored version %d priority %d; want nil, %d, %d",
				round, w.Key, err, got.Version, got.Priority, w.Version, round+1)
		}
	}
}
