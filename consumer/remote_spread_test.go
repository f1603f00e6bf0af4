package consumer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// A remote worker among others claims from its share of the backlog first,
// as a Go worker does, so that workers draining one backlog claim apart;
// with its share exhausted it claims from the rest.
func TestRemoteClaimsFromItsShareFirst(t *testing.T) {
	st := memstore.New(memstore.Config{}).Open()
	defer st.Close()
	rw, err := NewRemoteWorkers(RemoteConfig{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	for _, id := range []string{"w1", "w2", "w3"} {
		if _, _, err := rw.Heartbeat(t.Context(), RemoteWorker{ID: id, Instance: "i-" + id, Kinds: []string{"k"}, Concurrency: 8}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 300
	var ps []task.PublishParams
	for i := range n {
		ps = append(ps, task.PublishParams{Key: fmt.Sprintf("t%03d", i), Kind: "k"})
	}
	if _, err := task.PublishMany(t.Context(), st, ps); err != nil {
		t.Fatal(err)
	}
	ws, err := st.Workers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	self := ws[slices.IndexFunc(ws, func(w task.WorkerInfo) bool { return w.ID == "w1" })]
	share := preempt.NewPeers(ws, self, st.Now()).Share("w1", []string{"k"})
	if len(share) == 0 || len(share) == task.ShareBuckets {
		t.Fatalf("w1's share is %d of %d buckets: want a part", len(share), task.ShareBuckets)
	}
	inShare := 0
	for i := range n {
		doc, err := st.Get(t.Context(), fmt.Sprintf("t%03d", i))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(share, task.ShareBucket(doc.Seq)) {
			inShare++
		}
	}
	jobs, err := rw.Claim(t.Context(), RemoteClaim{ID: "w1", Instance: "i-w1", Max: inShare})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if !slices.Contains(share, task.ShareBucket(j.Task.Seq)) {
			t.Errorf("claimed %s (bucket %d) outside w1's share while its share had tasks", j.Task.Key, task.ShareBucket(j.Task.Seq))
		}
	}
	if len(jobs) != inShare {
		t.Fatalf("claimed %d, want the %d tasks of w1's share", len(jobs), inShare)
	}
	// The share drained, the rest of the backlog comes next.
	more, err := rw.Claim(t.Context(), RemoteClaim{ID: "w1", Instance: "i-w1", Max: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 5 {
		t.Fatalf("after its share, claimed %d of 5 from the rest", len(more))
	}
}

// The share never overtakes priority: a task of a higher priority outside
// a worker's share is claimed before the lower ones in it.
func TestRemoteShareKeepsPriority(t *testing.T) {
	st := memstore.New(memstore.Config{}).Open()
	defer st.Close()
	rw, err := NewRemoteWorkers(RemoteConfig{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	for _, id := range []string{"w1", "w2", "w3"} {
		if _, _, err := rw.Heartbeat(t.Context(), RemoteWorker{ID: id, Instance: "i-" + id, Kinds: []string{"k"}, Concurrency: 8}); err != nil {
			t.Fatal(err)
		}
	}
	var ps []task.PublishParams
	for i := range 100 {
		ps = append(ps, task.PublishParams{Key: fmt.Sprintf("low%03d", i), Kind: "k"})
	}
	for i := range 20 {
		ps = append(ps, task.PublishParams{Key: fmt.Sprintf("high%02d", i), Kind: "k", Options: task.Options{Priority: 5}})
	}
	if _, err := task.PublishMany(t.Context(), st, ps); err != nil {
		t.Fatal(err)
	}
	jobs, err := rw.Claim(t.Context(), RemoteClaim{ID: "w1", Instance: "i-w1", Max: 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Task.Priority != 5 {
			t.Errorf("claimed %s of priority %d while tasks of priority 5 were ready", j.Task.Key, j.Task.Priority)
		}
	}
	if len(jobs) != 20 {
		t.Fatalf("claimed %d, want the 20 of priority 5", len(jobs))
	}
}
