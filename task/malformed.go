package task

import (
	"log/slog"
	"maps"
	"sync"
)

// Readers of leasepool's own documents (flows, the control doorbell,
// pauses, limits, schedules and their cursors, device states, the
// retention policy) skip one they cannot read
// rather than fail the page, the list or the worker that reads it: one
// such document must not take down everything that lists its kind. They
// report it here, which logs it once and counts it, so that
// leasepool_malformed_documents_total shows it.

// maxMalformedSeen bounds the documents remembered as logged: past it a
// document may be logged again, never counted twice in a row.
const maxMalformedSeen = 10000

var malformed struct {
	mu     sync.Mutex
	seen   map[string]bool // kind + "\x00" + id
	counts map[string]int64
}

// SkipMalformed reports that a reader skipped the document id (a key or
// id and its version: what changes when it is rewritten) of kind (its
// namespace) because of err. The first report of a document in this process
// logs a warning with slog.Default and counts it in MalformedCounts; later
// ones do nothing.
func SkipMalformed(kind, id string, err error) {
	k := kind + "\x00" + id
	malformed.mu.Lock()
	if malformed.seen[k] {
		malformed.mu.Unlock()
		return
	}
	if malformed.seen == nil || len(malformed.seen) >= maxMalformedSeen {
		malformed.seen = map[string]bool{}
	}
	if malformed.counts == nil {
		malformed.counts = map[string]int64{}
	}
	malformed.seen[k] = true
	malformed.counts[kind]++
	malformed.mu.Unlock()
	slog.Warn("skipping a malformed document", slog.String("kind", kind), slog.String("id", id), slog.Any("err", err))
}

// MalformedCounts returns how many distinct malformed documents readers
// in this process skipped, by kind.
func MalformedCounts() map[string]int64 {
	malformed.mu.Lock()
	defer malformed.mu.Unlock()
	return maps.Clone(malformed.counts)
}
