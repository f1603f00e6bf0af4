package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// sameCounts reports whether a and b hold the same counts in any order.
func sameCounts(a, b []task.StateCount) bool {
	key := func(c task.StateCount) string { return fmt.Sprint(c.Kind, "/", c.State, "=", c.N) }
	ka, kb := make([]string, len(a)), make([]string, len(b))
	for i, c := range a {
		ka[i] = key(c)
	}
	for i, c := range b {
		kb[i] = key(c)
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// TestCountsFollowEveryWrite drives two Stores on one file (each misses
// what the other wrote) through concurrent publishes, state and kind
// changes of documents got every way (candidates, lists, gets, change
// streams), stale writes that conflict in the same group commits, and
// retention deletes, and checks after each round that Stats (read from
// task_counts) equals a count of the rows.
func TestCountsFollowEveryWrite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "counts.db")
	stores := []*sqlitestore.Store{open(t, path, nil), open(t, path, nil)}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	var streams []task.ChangeStream
	for _, s := range stores {
		cs, err := s.Watch(ctx, task.WatchParams{})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		streams = append(streams, cs)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []string{"k1", "k2", "k3"}
	states := []task.State{task.StatePending, task.StateRunning, task.StateSucceeded, task.StateFailed, task.StateCancelled}
	var keys []string
	for round := range 30 {
		for i := range 10 {
			key := fmt.Sprintf("t%d-%d", round, i)
			keys = append(keys, key)
			s := stores[rng.IntN(2)]
			if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: key, Kind: kinds[rng.IntN(3)]}); err != nil {
				t.Fatal(err)
			}
		}
		// Concurrent writers, some from a version another already
		// replaced: their conflicts share group commits with successes.
		type write struct {
			s   *sqlitestore.Store
			doc *task.Task
		}
		var writes []write
		for range 24 {
			i := rng.IntN(2)
			s := stores[i]
			var doc *task.Task
			switch rng.IntN(4) {
			case 3: // the newest change the stream has, often another Store's write
				doc = latestChange(ctx, streams[i])
				if doc == nil {
					continue
				}
			case 0:
				page, err := s.Candidates(ctx, task.CandidateQuery{Now: s.Now().Add(time.Hour), Ready: true, Limit: 50})
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					continue
				}
				doc = page[rng.IntN(len(page))]
			case 1: // a document the Store does not note
				page, err := s.List(ctx, task.ListQuery{Desc: true, Limit: 50})
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					continue
				}
				doc = page[rng.IntN(len(page))]
			default:
				doc, err = s.Get(ctx, keys[rng.IntN(len(keys))])
				if errors.Is(err, task.ErrNotFound) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			doc.State = states[rng.IntN(len(states))]
			if rng.IntN(5) == 0 {
				doc.Kind = kinds[rng.IntN(3)]
			}
			if rng.IntN(4) == 0 {
				doc.Priority = rng.IntN(3) // the full update, by key
			}
			writes = append(writes, write{s: s, doc: doc})
		}
		var wg sync.WaitGroup
		conflicts := 0 // or deleted
		var mu sync.Mutex
		for _, w := range writes {
			wg.Go(func() {
				err := w.s.Update(ctx, w.doc)
				// Stale, or deleted by the retention delete beside it.
				if errors.Is(err, task.ErrConflict) || errors.Is(err, task.ErrNotFound) {
					mu.Lock()
					conflicts++
					mu.Unlock()
					return
				}
				if err != nil {
					t.Error(err)
				}
			})
		}
		if rng.IntN(3) == 0 {
			wg.Go(func() {
				st := states[2+rng.IntN(3)]
				if _, err := stores[rng.IntN(2)].DeleteFinished(ctx, task.DeleteParams{State: st, Before: time.Now().Add(time.Hour), Limit: 5}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		want := rowCounts(t, db)
		for i, s := range stores {
			st, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !sameCounts(st.Counts, want) {
				t.Fatalf("round %d (%d conflicting writes), store %d: Stats %v; rows %v", round, conflicts, i, st.Counts, want)
			}
		}
	}
}

// latestChange reads cs until it has nothing more within 20 ms and
// returns the last change's document.
func latestChange(ctx context.Context, cs task.ChangeStream) *task.Task {
	var last *task.Task
	for {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		ev, err := cs.Next(rctx)
		cancel()
		if err != nil {
			return last
		}
		if ev.Task != nil {
			last = ev.Task
		}
	}
}

// rowCounts counts the task rows by state and kind, reserved ones left out.
func rowCounts(t *testing.T, db *sql.DB) []task.StateCount {
	t.Helper()
	lo, hi := task.ReservedRange()
	rows, err := db.Query(`SELECT state, kind, count(*) FROM tasks WHERE NOT (key >= ? AND key < ?) GROUP BY state, kind`, lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []task.StateCount
	for rows.Next() {
		var c task.StateCount
		if err := rows.Scan(&c.State, &c.Kind, &c.N); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}
