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
	c := &stream{s: s, p: p, done: make(chan struct{})}
	c.pos.Store(last)
	return c, nil
}

// stream is one change stream of a handle.
type stream struct {
	s         *Store
	p         task.WatchParams
	pos       atomic.Int64 // the last change handed out (or passed)
	closeOnce sync.Once
	done      chan struct{}
}

// Next returns the next change; see task.ChangeStream.
func (c *stream) Next(ctx context.Context) (task.Event, error) {
	db := c.s.db
	for {
		select {
		case <-c.done:
			return task.Event{}, task.ErrClosed
		case <-c.s.closed:
			return task.Event{}, task.ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return task.Event{}, err
		}
		db.mu.Lock()
		pos := c.pos.Load()
		if pos < db.dropped {
			db.mu.Unlock()
			return task.Event{}, fmt.Errorf("watch: change %d pruned: %w", pos+1, task.ErrHistoryLost)
		}
		if i := pos - db.dropped; i < int64(len(db.changes)) {
			ch := db.changes[i]
			db.mu.Unlock()
			if (ch.doc == nil && !c.p.WantsDocuments(ch.document.Namespace)) || (ch.doc != nil && c.p.SkipQuiet && ch.doc.Quiet()) {
				c.pos.Store(ch.seq)
				continue
			}
			// A change reaches a stream its latency after it was written,
			// whatever came before it: streams are pipelines, not one
			// round trip per event.
			if err := c.s.deliver(ctx, c.done, ch); err != nil {
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
		wake := db.wake
		db.mu.Unlock()
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

// deliver waits until ch is due at this handle (its latency after it was
// written) and returns its injected fault.
func (s *Store) deliver(ctx context.Context, done <-chan struct{}, ch change) error {
	if err := s.alive(ctx); err != nil {
		return err
	}
	if s.db.cfg.Latency != nil {
		if d := time.Until(ch.at.Add(s.db.cfg.Latency(OpNext, ch.key()))); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-done:
				t.Stop()
				return task.ErrClosed
			case <-s.closed:
				t.Stop()
				return task.ErrClosed
			}
		}
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
