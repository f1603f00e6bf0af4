// newer.go: the one rule by which the scheduler tells which of two
// documents of a task key it knows is the newer.

package claimtab

import "github.com/leasepool/leasepool/task"

// Newer reports whether document a is a later state of its task key than
// b, so that what this worker knows of the task (its heap entry, its
// attempt in flight, its parked entry, a refill page's row) should be a
// rather than b. A nil document is older than any other. Of two
// publishes under one key (the first deleted, the key published again),
// the one of greater Seq is the later, since Seq grows with publish
// time; within one publish, the greater Version. Equal documents are not
// newer than each other.
func Newer(a, b *task.Task) bool {
	switch {
	case a == nil:
		return false
	case b == nil:
		return true
	}
	return NewerVersion(a.Seq, a.Version, b.Seq, b.Version)
}

// NewerVersion is Newer for documents known by their Seq and Version.
func NewerVersion(aSeq, aVersion, bSeq, bVersion int64) bool {
	if aSeq != bSeq {
		return aSeq > bSeq
	}
	return aVersion > bVersion
}
