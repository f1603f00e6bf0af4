package web

// Cursor is the cursor of the tasks after (newer than) or before seq, for
// benchmarks that start deep in the list.
func Cursor(after bool, seq int64) string { return cursor{after: after, seq: seq}.String() }
