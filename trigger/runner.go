package trigger

// The Runner: the elected worker's duty that follows every active
// trigger's collection. Each trigger has a follower: a reader goroutine
// takes the stream's changes (and, when the stream is idle, its position)
// into a queue in order; the follower publishes what the queue holds in
// batches, and stores the position of the last item only once every task
// before it is published. A crash anywhere replays from the stored
// position, and the keys make the replay publish nothing new.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Runner defaults.
const (
	// DefaultPoll is how often the runner reads the triggers: an add,
	// pause, resume or rm takes effect within about this long.
	DefaultPoll = time.Second
	// DefaultBatch bounds the changes published at once.
	DefaultBatch = 256
	// DefaultIdleSave is how long a stream may be idle before its
	// position (past the changes the filter left out) is stored, so that
	// a quiet trigger does not fall behind the server's history.
	DefaultIdleSave = time.Second
	// DefaultScanPage is how many documents a rescan reads at once.
	DefaultScanPage = 500
)

// RunnerConfig configures a Runner. Zero values take the defaults.
type RunnerConfig struct {
	Store    task.Store
	Poll     time.Duration
	Batch    int
	IdleSave time.Duration
	ScanPage int
	// Retry is how long a follower waits after an error before it starts
	// again from the stored position. Default Poll.
	Retry  time.Duration
	Logger *slog.Logger
}

// Runner follows every active trigger. Run it as a duty of an elector
// (Duty), so that one process of the cluster publishes.
type Runner struct {
	cfg RunnerConfig
	log *slog.Logger
}

// NewRunner checks cfg and returns a Runner.
func NewRunner(cfg RunnerConfig) (*Runner, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("trigger runner: %w: store: required", task.ErrInvalid)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.IdleSave <= 0 {
		cfg.IdleSave = DefaultIdleSave
	}
	if cfg.ScanPage <= 0 {
		cfg.ScanPage = DefaultScanPage
	}
	if cfg.Retry <= 0 {
		cfg.Retry = cfg.Poll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Runner{cfg: cfg, log: cfg.Logger.With(slog.String("component", "trigger"))}, nil
}

// follower is one running trigger.
type follower struct {
	version int64
	stop    context.CancelFunc
	done    chan struct{}
}

// Duty follows every active trigger until ctx ends: the duty an elector
// runs while its process is elected. On the embedded store it publishes
// what the table triggers recorded (drainTables); on a store with
// neither collections nor tables it waits for ctx and does nothing.
func (r *Runner) Duty(ctx context.Context) error {
	if ts, ok := r.cfg.Store.(task.TableTriggerStore); ok {
		return r.drainTables(ctx, ts)
	}
	cw, ok := r.cfg.Store.(task.CollectionWatcher)
	if !ok {
		<-ctx.Done()
		return nil
	}
	running := map[string]*follower{}
	defer func() {
		for _, f := range running {
			f.stop()
			<-f.done
		}
	}()
	t := time.NewTicker(r.cfg.Poll)
	defer t.Stop()
	for {
		all, err := loadVersions(ctx, r.cfg.Store)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("triggers: not read; trying again next poll", slog.Any("err", err))
		}
		if err == nil {
			want := map[string]loaded{}
			for _, l := range all {
				if !l.t.Paused && l.t.Table == "" {
					want[l.t.Name] = l
				}
			}
			for name, f := range running {
				if l, ok := want[name]; !ok || l.version != f.version {
					f.stop()
					<-f.done
					delete(running, name)
				}
			}
			for name, l := range want {
				if _, ok := running[name]; !ok {
					running[name] = r.start(ctx, cw, l)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// start runs a follower of l's trigger until it is stopped, again after
// Retry whenever it fails.
func (r *Runner) start(ctx context.Context, cw task.CollectionWatcher, l loaded) *follower {
	fctx, stop := context.WithCancel(ctx)
	f := &follower{version: l.version, stop: stop, done: make(chan struct{})}
	log := r.log.With(slog.String("trigger", l.t.Name))
	go func() {
		defer close(f.done)
		for {
			err := r.follow(fctx, cw, l.t, log)
			if fctx.Err() != nil {
				return
			}
			log.Warn("trigger: stopped; starting again from its stored position", slog.Duration("after", r.cfg.Retry), slog.Any("err", err))
			select {
			case <-fctx.Done():
				return
			case <-time.After(r.cfg.Retry):
			}
		}
	}()
	return f
}

// item is what the reader hands the publisher: a change, or the stream's
// position while it is idle, or the error that ended it.
type item struct {
	change task.CollectionChange
	mark   task.Token
	err    error
}

// follow publishes t's changes until ctx ends or an error; a lost
// history is rescanned and followed on from there.
func (r *Runner) follow(ctx context.Context, cw task.CollectionWatcher, t *Trigger, log *slog.Logger) error {
	for {
		pos, ver, err := loadPosition(ctx, r.cfg.Store, t.Name)
		if err != nil {
			return fmt.Errorf("position: %w", err)
		}
		if pos.Rescan != nil && !pos.Rescan.Done {
			if err := r.rescan(ctx, cw, t, log, pos, ver, pos.Rescan.From); err != nil {
				return err
			}
			continue
		}
		err = r.stream(ctx, cw, t, log, pos, ver)
		if !errors.Is(err, task.ErrHistoryLost) || ctx.Err() != nil {
			return err
		}
		log.Warn("trigger: the server no longer has its position: rescanning the matching documents", slog.Any("err", err))
		if pos, ver, err = loadPosition(ctx, r.cfg.Store, t.Name); err != nil {
			return fmt.Errorf("position: %w", err)
		}
		// The stream goes on from a second before the scan starts, so a
		// change made while it runs publishes even if the scan missed it.
		if err := r.rescan(ctx, cw, t, log, pos, ver, r.cfg.Store.Now().UTC().Add(-time.Second)); err != nil {
			return err
		}
	}
}

// stream follows t's change stream from pos until an error.
func (r *Runner) stream(ctx context.Context, cw task.CollectionWatcher, t *Trigger, log *slog.Logger, pos Position, ver int64) error {
	from := task.CollectionPosition{Token: pos.Token, StartAt: pos.StartAt}
	if len(from.Token) == 0 && from.StartAt.IsZero() {
		from.StartAt = t.Since
	}
	s, err := cw.WatchCollection(ctx, t.Watch(), from)
	if err != nil {
		return err
	}
	defer s.Close()
	rctx, stopReader := context.WithCancel(ctx)
	items := make(chan item, r.cfg.Batch)
	var wg sync.WaitGroup
	wg.Go(func() { r.read(rctx, s, items) })
	defer func() { stopReader(); wg.Wait() }()
	log.Debug("trigger: following", slog.Bool("resumed", len(from.Token) > 0))
	for {
		var batch []item
		select {
		case <-ctx.Done():
			return ctx.Err()
		case it := <-items:
			batch = append(batch, it)
		}
	fill:
		for len(batch) < r.cfg.Batch && batch[len(batch)-1].err == nil {
			select {
			case it := <-items:
				batch = append(batch, it)
			default:
				break fill
			}
		}
		last := batch[len(batch)-1]
		if last.err != nil {
			batch = batch[:len(batch)-1]
		}
		if ver, err = r.publish(ctx, t, batch, &pos, ver); err != nil {
			return err
		}
		if last.err != nil {
			return last.err
		}
	}
}

// read hands the stream's changes to items in order; after IdleSave with
// none, the stream's position, which is then past every change handed
// over.
func (r *Runner) read(ctx context.Context, s task.CollectionStream, items chan<- item) {
	for {
		nctx, cancel := context.WithTimeout(ctx, r.cfg.IdleSave)
		ch, err := s.Next(nctx)
		cancel()
		var it item
		switch {
		case err == nil:
			it = item{change: ch}
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded):
			it = item{mark: s.ResumeToken()}
		default:
			it = item{err: err}
		}
		select {
		case items <- it:
		case <-ctx.Done():
			return
		}
		if it.err != nil {
			return
		}
	}
}

// publish publishes the changes of batch, then stores the position of its
// last item; ver is the position document's version, and the new one is
// returned.
func (r *Runner) publish(ctx context.Context, t *Trigger, batch []item, pos *Position, ver int64) (int64, error) {
	var ps []task.PublishParams
	var tok task.Token
	for _, it := range batch {
		if it.mark != nil {
			tok = it.mark
			continue
		}
		ch := it.change
		tok = ch.Token
		p := t.params(ChangeKey(t.Name, ch.Token), t.Payload(ch.ID, ch.Document))
		if err := p.Validate(); err != nil {
			// A document too large or too deep for a payload: its _id
			// stands for it, so the change is not lost.
			r.log.Warn("trigger: document refused as a payload; publishing its _id", slog.String("trigger", t.Name),
				slog.String("key", p.Key), slog.Any("err", err))
			p.Payload = t.Payload(ch.ID, nil)
		}
		ps = append(ps, p)
	}
	if len(ps) > 0 {
		outs, err := task.PublishMany(ctx, r.cfg.Store, ps)
		if err != nil {
			return ver, err
		}
		for i, o := range outs {
			if o.Err != nil {
				return ver, fmt.Errorf("publish %s: %w", ps[i].Key, o.Err)
			}
		}
	}
	if len(tok) == 0 || bytes.Equal(tok, pos.Token) {
		return ver, nil
	}
	next := *pos
	next.Token, next.StartAt = tok, time.Time{}
	next.Published += int64(len(ps))
	nv, err := savePosition(ctx, r.cfg.Store, t.Name, ver, next)
	if err != nil {
		return ver, fmt.Errorf("position: %w", err)
	}
	*pos = next
	return nv, nil
}

// rescan publishes a task for every document matching t's filter, keyed
// by its _id and version (ScanKey), and then stores the position from
// which the stream goes on: from. The rescan is stored as started first,
// so that a runner that finds it unfinished does it again.
func (r *Runner) rescan(ctx context.Context, cw task.CollectionWatcher, t *Trigger, log *slog.Logger, pos Position, ver int64, from time.Time) error {
	rs := Rescan{From: from}
	if pos.Rescan != nil {
		rs.Count = pos.Rescan.Count
		if !pos.Rescan.Done {
			rs.Count-- // the same rescan, again
		}
	}
	rs.Count++
	pos.Token, pos.StartAt, pos.Rescan = nil, from, &rs
	ver, err := savePosition(ctx, r.cfg.Store, t.Name, ver, pos)
	if err != nil {
		return fmt.Errorf("position: %w", err)
	}
	var after []byte
	for {
		docs, err := cw.ScanCollection(ctx, t.Watch(), after, r.cfg.ScanPage)
		if err != nil {
			return fmt.Errorf("rescan: %w", err)
		}
		if len(docs) == 0 {
			break
		}
		ps := make([]task.PublishParams, 0, len(docs))
		for _, d := range docs {
			p := t.params(ScanKey(t.Name, d.ID, t.version(d.Document)), t.Payload(d.ID, d.Document))
			if p.Validate() != nil {
				p.Payload = t.Payload(d.ID, nil)
			}
			ps = append(ps, p)
		}
		outs, err := task.PublishMany(ctx, r.cfg.Store, ps)
		if err != nil {
			return fmt.Errorf("rescan: %w", err)
		}
		for i, o := range outs {
			if o.Err != nil {
				return fmt.Errorf("rescan: publish %s: %w", ps[i].Key, o.Err)
			}
		}
		rs.Published += int64(len(docs))
		after = docs[len(docs)-1].Cursor
	}
	rs.Done = true
	pos.Rescan = &rs
	if _, err := savePosition(ctx, r.cfg.Store, t.Name, ver, pos); err != nil {
		return fmt.Errorf("position: %w", err)
	}
	log.Info("trigger: rescan done", slog.Int64("documents", rs.Published), slog.Time("from", from))
	return nil
}
