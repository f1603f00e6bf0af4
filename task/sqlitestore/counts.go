// counts.go keeps task_counts, the number of tasks per kind and state,
// in the same transactions as the task writes, so that Stats reads a few
// rows instead of counting every task, and no index by (kind, state)
// has to be rewritten by every claim and finish.

package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/leasepool/leasepool/task"
)

// countMove is a change of one (kind, state) count by n.
type countMove struct {
	kind  string
	state task.State
	n     int64
}

// moved records a task moving from (fromKind, from) to (toKind, to).
func (r *writeReq) moved(fromKind string, from task.State, toKind string, to task.State) {
	if fromKind == toKind && from == to {
		return
	}
	r.counts = append(r.counts, countMove{fromKind, from, -1}, countMove{toKind, to, 1})
}

// applyCounts adds the count moves of the batch's requests that succeeded
// to task_counts, in the batch's transaction. A request that failed wrote
// nothing (see runOne), so its moves are left out.
func (s *Store) applyCounts(tx *sql.Tx, batch []*writeReq, errs []error) error {
	type group struct {
		kind  string
		state task.State
	}
	var sum map[group]int64
	for i, r := range batch {
		if errs[i] != nil {
			continue
		}
		for _, m := range r.counts {
			if sum == nil {
				sum = make(map[group]int64, 4)
			}
			sum[group{m.kind, m.state}] += m.n
		}
	}
	for g, n := range sum {
		if n == 0 {
			continue
		}
		if _, err := s.txStmt(tx, s.upsertCount).Exec(g.kind, string(g.state), n); err != nil {
			return mapErr(err)
		}
	}
	return nil
}

// readStored returns the kind and state of the stored version of key, if
// it is version; ok is false otherwise (an update of it will not apply).
func (s *Store) readStored(ctx context.Context, tx *sql.Tx, key string, version int64) (kind string, state task.State, ok bool, err error) {
	var st string
	err = tx.StmtContext(ctx, s.selStored).QueryRowContext(ctx, key, version).Scan(&kind, &st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, nil
	}
	return kind, task.State(st), err == nil, mapErr(err)
}

// seenVersions remembers the kind and state of task versions this Store
// wrote or read lately, by seq: a version (seq, version) is one document
// forever, so an update of a version seen needs no read to know what it
// moves in task_counts. Bounded: it starts over when full.
type seenVersions struct {
	mu sync.Mutex
	m  map[int64]seenVersion
}

type seenVersion struct {
	version int64
	kind    string
	state   task.State
}

const seenMax = 1 << 14

func (c *seenVersions) note(ts ...*task.Task) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range ts {
		if t.Seq != 0 {
			c.noteLocked(t.Seq, seenVersion{t.Version, t.Kind, t.State})
		}
	}
}

// noteVersion notes that version v of the task of seq has v's kind and state.
func (c *seenVersions) noteVersion(seq int64, v seenVersion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noteLocked(seq, v)
}

func (c *seenVersions) noteLocked(seq int64, v seenVersion) {
	if c.m == nil || len(c.m) >= seenMax {
		c.m = make(map[int64]seenVersion, 1024)
	}
	if old, ok := c.m[seq]; !ok || old.version < v.version {
		c.m[seq] = v
	}
}

func (c *seenVersions) lookup(seq, version int64) (string, task.State, bool) {
	if seq == 0 {
		return "", "", false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[seq]
	if !ok || v.version != version {
		return "", "", false
	}
	return v.kind, v.state, true
}
