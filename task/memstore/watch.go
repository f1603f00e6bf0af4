// watch.go: change streams over the store's change log.

package memstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Watch opens a change stream; see task.Store.
func (s *Store) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	if _, err := s.enter(ctx, OpWatch, ""); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	select {
	case <-s.closed:
		return nil, fmt.Errorf("watch: %w", task.ErrClosed) // closed while it waited: no lane for it
	default:
	}
	last := db.dropped + int64(len(db.changes))
	if p.ResumeAfter != nil {
		if len(p.ResumeAfter) != 8 {
			return nil, fmt.Errorf("watch: resume token of %d bytes: %w", len(p.ResumeAfter), task.ErrHistoryLost)
		}
		after := int64(binary.BigEndian.Uint64(p.ResumeAfter))
		if after < db.dropped || after > last {
			return nil, fmt.Errorf("watch: resume after change %d: %w", after, task.ErrHistoryLost)
		}
		last = after
	}
	c := &stream{s: s, p: p, lane: s.joinLane(), done: make(chan struct{})}
	c.pos.Store(last)
	return c, nil
}

// lane is a delivery schedule: the changes that have reached the streams
// of its handles. A change reaches a lane its latency after it was
// written, but never before the changes ahead of it: streams are
// pipelines, not one round trip per event.
type lane struct {
	// through is the last change that has reached the lane, with every
	// change before it.
	through int64
	// arrived[i] tells whether change through+1+i has reached the lane
	// (while one before it has not).
	arrived []bool
	// moved is closed when through moves; loud, when it moves past a
	// change that is not a quiet task write (streams with SkipQuiet wait
	// on loud alone).
	moved, loud chan struct{}
}

// joinLane returns the handle's lane, made or shared on its first Watch.
// db.mu held.
func (s *Store) joinLane() *lane {
	db := s.db
	if s.lane != nil {
		return s.lane
	}
	var l *lane
	if db.cfg.Lanes > 0 {
		if db.shared == nil {
			db.shared = make([]*lane, db.cfg.Lanes)
		}
		l = db.shared[s.index%db.cfg.Lanes]
	}
	if l == nil {
		l = &lane{through: db.dropped + int64(len(db.changes)), moved: make(chan struct{}), loud: make(chan struct{})}
		db.lanes = append(db.lanes, l)
		if db.cfg.Lanes > 0 {
			db.shared[s.index%db.cfg.Lanes] = l
		}
	}
	s.lane = l
	return l
}

// send schedules c's arrival at l. db.mu held.
func (db *DB) send(l *lane, c change) {
	l.arrived = append(l.arrived, false)
	var d time.Duration
	if db.cfg.Latency != nil {
		d = db.cfg.Latency(OpNext, c.key())
	}
	if d <= 0 {
		db.arrive(l, c.seq)
		return
	}
	time.AfterFunc(d, func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		db.arrive(l, c.seq)
	})
}

// arrive marks change seq as reached l and moves l.through over every
// change that has. db.mu held.
func (db *DB) arrive(l *lane, seq int64) {
	l.arrived[seq-l.through-1] = true
	from := l.through
	for len(l.arrived) > 0 && l.arrived[0] {
		l.arrived = l.arrived[1:]
		l.through++
	}
	if l.through == from {
		return
	}
	close(l.moved)
	l.moved = make(chan struct{})
	for seq := from + 1; seq <= l.through; seq++ {
		if i := seq - db.dropped - 1; i < 0 || !db.changes[i].quiet {
			close(l.loud)
			l.loud = make(chan struct{})
			break
		}
	}
}

// stream is one change stream of a handle.
type stream struct {
	s         *Store
	p         task.WatchParams
	lane      *lane
	pos       atomic.Int64 // the last change handed out (or passed)
	closeOnce sync.Once
	done      chan struct{}
}

// Next returns the next change; see task.ChangeStream.
func (c *stream) Next(ctx context.Context) (task.Event, error) {
	db := c.s.db
	for {
		if err := c.ended(ctx); err != nil {
			return task.Event{}, err
		}
		db.mu.Lock()
		pos := c.pos.Load()
		if pos < db.dropped {
			db.mu.Unlock()
			return task.Event{}, fmt.Errorf("watch: change %d pruned: %w", pos+1, task.ErrHistoryLost)
		}
		wake := c.lane.moved
		if c.p.SkipQuiet {
			wake = c.lane.loud
		}
		if i := pos - db.dropped; i < int64(len(db.changes)) {
			ch := db.changes[i]
			if (ch.doc == nil && !c.p.WantsDocuments(ch.document.Namespace)) || (ch.doc != nil && (c.p.NoTasks || c.p.SkipQuiet && ch.quiet)) {
				db.mu.Unlock()
				c.pos.Store(ch.seq)
				continue
			}
			arrived := ch.seq <= c.lane.through
			db.mu.Unlock()
			if arrived {
				if err := c.s.deliver(ctx, ch); err != nil {
					return task.Event{}, fmt.Errorf("watch: %w", err)
				}
				c.pos.Store(ch.seq)
				c.s.n.events.Add(1)
				db.total.events.Add(1)
				if ch.doc == nil {
					d := *ch.document
					d.Value = slices.Clone(d.Value)
					return task.Event{Document: &d, DocumentDeleted: ch.deleted, Token: token(ch.seq)}, nil
				}
				return task.Event{Key: ch.doc.Key, Task: ch.doc.Clone(), Version: ch.doc.Version, Token: token(ch.seq)}, nil
			}
		} else {
			db.mu.Unlock()
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return task.Event{}, ctx.Err()
		case <-c.done:
			return task.Event{}, task.ErrClosed
		case <-c.s.closed:
			return task.Event{}, task.ErrClosed
		}
	}
}

// ended returns why c can hand out no more, if it cannot. Each check is
// a select of its own: one receive with a default reads a channel without
// taking its lock, and a thousand streams check on every change.
func (c *stream) ended(ctx context.Context) error {
	select {
	case <-c.done:
		return task.ErrClosed
	default:
	}
	select {
	case <-c.s.closed:
		return task.ErrClosed
	default:
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	default:
	}
	return nil
}

// deliver returns the injected fault of handing ch, which has reached
// this handle's lane, to one of its streams.
func (s *Store) deliver(ctx context.Context, ch change) error {
	if err := s.alive(ctx); err != nil {
		return err
	}
	if s.db.cfg.Fault != nil {
		if f := s.db.cfg.Fault(OpNext, ch.key()); f.Err != nil {
			return f.Err
		}
	}
	return nil
}

// ResumeToken is the position after the last change handed out.
func (c *stream) ResumeToken() task.Token { return token(c.pos.Load()) }

// Close ends the stream.
func (c *stream) Close() error {
	c.closeOnce.Do(func() { close(c.done) })
	return nil
}

func token(seq int64) task.Token { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }
