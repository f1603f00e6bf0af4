package claimtab

import (
	"testing"

	"github.com/leasepool/leasepool/task"
)

// TestNewer is the table of the one rule every part of the scheduler
// uses to keep the newer of two documents of a task key.
func TestNewer(t *testing.T) {
	doc := func(seq, version int64) *task.Task { return &task.Task{Key: "k", Seq: seq, Version: version} }
	for _, c := range []struct {
		name string
		a, b *task.Task
		want bool
	}{
		{"later version", doc(3, 5), doc(3, 4), true},
		{"earlier version", doc(3, 4), doc(3, 5), false},
		{"same version", doc(3, 5), doc(3, 5), false},
		{"published again, lower version", doc(9, 1), doc(3, 40), true},
		{"the deleted publish, higher version", doc(3, 40), doc(9, 1), false},
		{"anything over nothing", doc(1, 1), nil, true},
		{"nothing over anything", nil, doc(1, 1), false},
		{"nothing over nothing", nil, nil, false},
	} {
		if got := Newer(c.a, c.b); got != c.want {
			t.Errorf("%s: newer = %v, want %v", c.name, got, c.want)
		}
		if c.a != nil && c.b != nil {
			if got := NewerVersion(c.a.Seq, c.a.Version, c.b.Seq, c.b.Version); got != c.want {
				t.Errorf("%s: newerVersion = %v, want %v", c.name, got, c.want)
			}
		}
		if c.want && Newer(c.b, c.a) {
			t.Errorf("%s: newer both ways", c.name)
		}
	}
}
