// groups.go checks what groups and concurrency limits need of a store: a
// task's group and its attempts' concurrency slots kept through every
// write and read, a bad group refused with nothing written, and slot locks
// in task.LockConcurrency held apart from tasks' keys, renewed by their
// holder, lapsing at a dead holder's lease end.

package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func (s suite) groups(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)

	stored, _, err := task.Publish(ctx, st, task.PublishParams{Key: "g1", Kind: "k", Options: task.Options{Group: "acme"}})
	if err != nil {
		t.Fatalf("publish with a group: %v", err)
	}
	if stored.Group != "acme" {
		t.Fatalf("published group %q, want acme", stored.Group)
	}
	for _, bad := range []string{"ac\x01me", "tab\there", "new\nline"} {
		_, _, err := task.Publish(ctx, st, task.PublishParams{Key: "bad", Kind: "k", Options: task.Options{Group: bad}})
		if !errors.Is(err, task.ErrInvalid) || !strings.HasPrefix(strings.TrimPrefix(err.Error(), "invalid: "), "group: ") {
			t.Fatalf("publish with group %q: %v; want ErrInvalid naming the field group", bad, err)
		}
		requireAbsent(t, st, "bad")
	}

	// A claim records its slots in its attempt; the group and the slots
	// survive the write, Get, Candidates and the history.
	now := st.Now()
	holder := task.Holder{WorkerID: "w1", Instance: "i1"}
	claimed, err := task.Modify(ctx, st, "g1", func(tk *task.Task) error {
		h := tk.Claim(holder, now)
		tk.Attempts[tk.Entry(h)].Slots = []string{"group:acme#2"}
		return nil
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	got, err := st.Get(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Group != "acme" || len(got.Attempts) != 1 || len(got.Attempts[0].Slots) != 1 || got.Attempts[0].Slots[0] != "group:acme#2" {
		t.Fatalf("after the claim: group %q attempts %+v; want group acme and slots [group:acme#2]", got.Group, got.Attempts)
	}
	h := claimed.Attempts[0].Holder("g1")
	if _, err := task.Modify(ctx, st, "g1", func(tk *task.Task) error { return tk.Release(h, st.Now()) }); err != nil {
		t.Fatalf("release: %v", err)
	}
	got, err = st.Get(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Group != "acme" || len(got.History) != 1 || len(got.History[0].Slots) != 1 {
		t.Fatalf("after the release: group %q history %+v; want the slots kept in history", got.Group, got.History)
	}
	page, err := st.Candidates(ctx, task.CandidateQuery{Ready: true, Now: st.Now().Add(time.Minute), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || page[0].Group != "acme" {
		t.Fatalf("candidates %v; want g1 with its group", keys(page))
	}

	// A group's head: Candidates with Group keeps that group's tasks.
	for _, p := range []task.PublishParams{
		{Key: "o1", Kind: "k", Options: task.Options{Group: "other"}},
		{Key: "u1", Kind: "k"},
		{Key: "g2", Kind: "k", Options: task.Options{Group: "acme", Priority: 1}},
	} {
		if _, _, err := task.Publish(ctx, st, p); err != nil {
			t.Fatal(err)
		}
	}
	later := st.Now().Add(time.Minute)
	for _, q := range []task.CandidateQuery{{Ready: true, Now: later, Group: "acme", Limit: 10}, {Now: st.Now().Add(-time.Hour), Group: "acme", Limit: 10}} {
		page, err := st.Candidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"g2", "g1"}
		if !q.Ready {
			want = []string{"g1", "g2"} // by claim time: g1 was published first
		}
		if got := keys(page); !slicesEqual(got, want) {
			t.Fatalf("candidates of group acme (ready %v): %v; want %v", q.Ready, got, want)
		}
		if !q.Ready {
			continue
		}
		// On from a task held (a worker reads a group's head past what
		// it holds): the next priority's tasks follow.
		q.After = page[0]
		next, err := st.Candidates(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if got := keys(next); !slicesEqual(got, []string{"g1"}) {
			t.Fatalf("candidates of group acme after g2: %v; want [g1]", got)
		}
	}

	// Slot locks: N holders at most; a key of a concurrency slot is not a
	// task's lock key; a renewal by the holder extends it; a dead
	// holder's lapses at its lease end; a release frees it.
	base := st.Now().Truncate(time.Millisecond)
	a := task.Holder{TaskKey: "a", WorkerID: "wa", Attempt: 1}
	b := task.Holder{TaskKey: "b", WorkerID: "wb", Attempt: 1}
	take := func(ns task.LockNamespace, h task.Holder, at, until time.Time) error {
		return st.AcquireLocks(ctx, task.LockParams{Namespace: ns, Keys: []string{"group:acme#0"}, Holder: h, Now: at, Until: until})
	}
	if err := take(task.LockConcurrency, a, base, base.Add(time.Second)); err != nil {
		t.Fatalf("a takes the slot: %v", err)
	}
	if err := take(task.LockTask, b, base, base.Add(time.Minute)); err != nil {
		t.Fatalf("b takes the task lock of the same name: %v", err)
	}
	lockedIn(t, "b on a's slot", take(task.LockConcurrency, b, base, base.Add(time.Minute)), task.LockConcurrency, "group:acme#0", a, base.Add(time.Second))
	if err := take(task.LockConcurrency, a, base.Add(500*time.Millisecond), base.Add(2*time.Second)); err != nil {
		t.Fatalf("a renews its slot: %v", err)
	}
	lockedIn(t, "b on a's renewed slot past its first end", take(task.LockConcurrency, b, base.Add(1500*time.Millisecond), base.Add(time.Minute)), task.LockConcurrency, "group:acme#0", a, base.Add(2*time.Second))
	if err := take(task.LockConcurrency, b, base.Add(2*time.Second), base.Add(3*time.Second)); err != nil {
		t.Fatalf("b takes the slot at a's lease end (a dead): %v", err)
	}
	if err := st.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockConcurrency, Keys: []string{"group:acme#0"}, Holder: b}); err != nil {
		t.Fatalf("b releases: %v", err)
	}
	if err := take(task.LockConcurrency, a, base.Add(2100*time.Millisecond), base.Add(time.Minute)); err != nil {
		t.Fatalf("a takes the released slot: %v", err)
	}
	var le *task.LockedError
	if err := take(task.LockConcurrency, b, base.Add(2200*time.Millisecond), base.Add(time.Minute)); !errors.As(err, &le) {
		t.Fatalf("b on a's slot again: %v, want LockedError", err)
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
