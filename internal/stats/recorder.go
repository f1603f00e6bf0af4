package stats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// DefaultEvery is how often a Recorder adds what it counted to the
// buckets: one compare-and-set write per bucket touched, so a worker's
// writes for the charts do not grow with its throughput.
const DefaultEvery = 5 * time.Second

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Store keeps the buckets and answers the queue samples. Required.
	Store task.Store
	// Every is how often the counts are written. Default DefaultEvery.
	Every time.Duration
	// Logger gets failed flushes. Default slog.Default().
	Logger *slog.Logger
	// Samples, when set, says whether this recorder samples the queue
	// now. A worker gives the holder of an elected duty, so that each
	// minute one recorder in the cluster reads the queue and its bucket
	// rather than every one: a recorder for which it is false reads
	// nothing for the sample. Exactly one sample per minute holds however
	// the duty moves, the holder checking that the minute has none yet
	// and the sample written by compare-and-set. Nil: every recorder
	// samples each minute it finds unsampled, one read per recorder per
	// minute.
	Samples func() bool
}

// Recorder is a consumer.Observer that counts the outcomes its worker
// writes, by kind, in the minute and quarter hour (store time) they were
// written, and adds them to the buckets every Every (Flush). Once a
// minute one of the recorders sharing a store samples the queue into the
// minute's bucket (the first to find it unsampled, among those whose
// Samples says so) and drops buckets past their resolution's Keep.
//
// Counts are exact under any number of recorders: a flush adds to a
// bucket by compare-and-set, and a write that failed without saying
// whether it landed is retried only if the bucket's note of this
// recorder's flushes says it did not. What a process counted but did not
// flush yet (at most Every) is lost if it is killed; Stop flushes.
type Recorder struct {
	store   task.Store
	log     *slog.Logger
	every   time.Duration
	samples func() bool
	// id names this recorder in the buckets' Flushes.
	id string

	mu    sync.Mutex
	fresh map[docKey]*delta // counted since the last flush

	flushMu  sync.Mutex // one flush at a time; guards the fields below
	inflight map[docKey]written
	seq      int64
	sampled  string // the minute bucket known to hold a queue sample
	pruned   string // the quarter bucket current at the last prune of quarters

	stop chan struct{}
	done chan struct{}
}

// docKey names one bucket document.
type docKey struct {
	res Resolution
	id  string
}

// delta is what a flush adds to one bucket.
type delta struct {
	kinds map[string]Counts
	queue *Queue
}

func (d *delta) empty() bool { return d == nil || (len(d.kinds) == 0 && d.queue == nil) }

func (d *delta) add(kind string, c Counts) {
	if d.kinds == nil {
		d.kinds = map[string]Counts{}
	}
	cur := d.kinds[kind]
	cur.add(c)
	d.kinds[kind] = cur
}

func (d *delta) merge(o *delta) {
	if o == nil {
		return
	}
	for k, c := range o.kinds {
		d.add(k, c)
	}
	if o.queue != nil && d.queue == nil {
		d.queue = o.queue
	}
}

// written is a flush whose write failed with an error that does not say
// whether it landed.
type written struct {
	seq int64
	d   *delta
}

// NewRecorder returns a Recorder; Start runs its flushes.
func NewRecorder(cfg RecorderConfig) (*Recorder, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("stats: %w: Store: required", task.ErrInvalid)
	}
	if cfg.Every < 0 {
		return nil, fmt.Errorf("stats: %w: Every: must not be negative, got %s", task.ErrInvalid, cfg.Every)
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails
	return &Recorder{store: cfg.Store, log: cfg.Logger, every: cfg.Every, samples: cfg.Samples, id: hex.EncodeToString(id[:]),
		fresh: map[docKey]*delta{}, inflight: map[docKey]written{}}, nil
}

// Claimed counts the expired leases the claim took over.
func (r *Recorder) Claimed(e consumer.ClaimEvent) {
	if e.TakenOver > 0 {
		r.count(e.Kind, Counts{Expired: int64(e.TakenOver)})
	}
}

// ClaimConflict counts nothing.
func (r *Recorder) ClaimConflict(string) {}

// Finished counts the attempt's outcome if it wrote one that ends or
// retries the task.
func (r *Recorder) Finished(e consumer.FinishEvent) {
	var c Counts
	switch e.Outcome {
	case consumer.OutcomeSucceeded:
		c.Succeeded = 1
	case consumer.OutcomeFailed:
		c.Failed = 1
	case consumer.OutcomeRetried:
		c.Retried = 1
	case consumer.OutcomeCancelled:
		c.Cancelled = 1
	default:
		return // nothing written, or the task given back: not an outcome
	}
	r.count(e.Kind, c)
}

// count adds c to kind in the buckets of now.
func (r *Recorder) count(kind string, c Counts) {
	now := r.store.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range []Resolution{Minute, Quarter} {
		r.deltaLocked(docKey{res, res.BucketID(now)}).add(kind, c)
	}
}

func (r *Recorder) deltaLocked(k docKey) *delta {
	d := r.fresh[k]
	if d == nil {
		d = &delta{}
		r.fresh[k] = d
	}
	return d
}

// Start runs the flushes until Stop.
func (r *Recorder) Start() {
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(r.done)
		tick := time.NewTicker(r.every)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), 4*r.every)
				if err := r.Flush(ctx); err != nil {
					r.log.Warn("stats: flush failed; retried at the next one", "err", err)
				}
				cancel()
			}
		}
	}()
}

// Stop ends the flushes started by Start and flushes what is left.
func (r *Recorder) Stop(ctx context.Context) error {
	if r.stop != nil {
		close(r.stop)
		<-r.done
		r.stop = nil
	}
	return r.flush(ctx, false)
}

// Flush samples the queue when the current minute has no sample yet, then
// adds what was counted to the buckets. What it could not write stays for
// the next flush.
func (r *Recorder) Flush(ctx context.Context) error { return r.flush(ctx, true) }

func (r *Recorder) flush(ctx context.Context, sample bool) error {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	var errs []error
	sampledNow := ""
	if sample && (r.samples == nil || r.samples()) {
		id, err := r.sampleQueue(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		sampledNow = id
	}
	r.mu.Lock()
	fresh := r.fresh
	r.fresh = map[docKey]*delta{}
	r.mu.Unlock()
	keys := make(map[docKey]bool, len(fresh)+len(r.inflight))
	for k := range fresh {
		keys[k] = true
	}
	for k := range r.inflight {
		keys[k] = true
	}
	for k := range keys {
		if err := r.apply(ctx, k, fresh[k]); err != nil {
			errs = append(errs, err)
		}
	}
	if sampledNow != "" {
		if _, failed := r.inflight[docKey{Minute, sampledNow}]; !failed {
			r.sampled = sampledNow
			r.prune(ctx, Minute)
			// Which quarters are past Keep changes once a quarter hour.
			if q := Quarter.BucketID(r.store.Now()); q != r.pruned {
				r.prune(ctx, Quarter)
				r.pruned = q
			}
		}
	}
	return errors.Join(errs...)
}

// apply adds d, and any earlier write of k not known to have landed, to
// bucket k.
func (r *Recorder) apply(ctx context.Context, k docKey, d *delta) error {
	prev, hasPrev := r.inflight[k]
	delete(r.inflight, k)
	for {
		doc, err := r.store.GetDocument(ctx, k.res.Namespace, k.id)
		switch {
		case errors.Is(err, task.ErrNotFound):
			doc = task.Document{Namespace: k.res.Namespace, ID: k.id}
		case err != nil:
			r.keep(k, prev, hasPrev, d)
			return fmt.Errorf("stats: read %s: %w", k.id, err)
		}
		var b Bucket
		if doc.Version > 0 {
			if b, err = decode(doc); err != nil {
				return fmt.Errorf("stats: bucket %s: %w", k.id, err) // not ours to overwrite
			}
		} else if b.Start, err = time.Parse(idLayout, k.id); err != nil {
			return fmt.Errorf("stats: bucket id %q: %w", k.id, err)
		}
		all := &delta{}
		all.merge(d)
		if hasPrev && b.Flushes[r.id] < prev.seq {
			all.merge(prev.d)
		}
		if all.empty() {
			return nil
		}
		if all.queue != nil && len(all.kinds) == 0 && b.Queue != nil && k.res.Step == time.Minute {
			return nil // sampled by another recorder meanwhile
		}
		r.seq++
		k.res.merge(&b, all)
		if b.Flushes == nil {
			b.Flushes = map[string]int64{}
		}
		b.Flushes[r.id] = r.seq
		doc.Value, err = json.Marshal(b)
		if err != nil {
			return fmt.Errorf("stats: bucket %s: %w", k.id, err)
		}
		_, err = r.store.PutDocument(task.WithInternalWrite(ctx), doc)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, task.ErrConflict):
			continue // another recorder wrote it first: read it again
		default:
			r.inflight[k] = written{seq: r.seq, d: all}
			return fmt.Errorf("stats: write %s: %w", k.id, err)
		}
	}
}

// keep puts back what a flush could not even try to write.
func (r *Recorder) keep(k docKey, prev written, hasPrev bool, d *delta) {
	if hasPrev {
		r.inflight[k] = prev
	}
	if d.empty() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deltaLocked(k).merge(d)
}

// sampleQueue adds a queue sample to this minute's and quarter's buckets
// when the minute has none yet, returning the minute's id ("" when there
// was nothing to do).
func (r *Recorder) sampleQueue(ctx context.Context) (string, error) {
	now := r.store.Now()
	id := Minute.BucketID(now)
	if r.sampled == id {
		return "", nil
	}
	doc, err := r.store.GetDocument(ctx, MinuteNamespace, id)
	if err == nil {
		if b, derr := decode(doc); derr == nil && b.Queue != nil {
			r.sampled = id
			return "", nil
		}
	} else if !errors.Is(err, task.ErrNotFound) {
		return "", fmt.Errorf("stats: read %s: %w", id, err)
	}
	st, err := r.store.Stats(ctx)
	if err != nil {
		return "", fmt.Errorf("stats: queue sample: %w", err)
	}
	q := &Queue{At: now, Pending: st.ByState()[task.StatePending]}
	if !st.OldestReadyAt.IsZero() && now.After(st.OldestReadyAt) {
		q.OldestReady = task.Duration(now.Sub(st.OldestReadyAt))
	}
	r.mu.Lock()
	r.deltaLocked(docKey{Minute, id}).queue = q
	r.deltaLocked(docKey{Quarter, Quarter.BucketID(now)}).queue = q
	r.mu.Unlock()
	return id, nil
}

// prune deletes the buckets of res older than res.Keep. Conflicts and
// buckets gone already are another recorder's prune: nothing to do.
func (r *Recorder) prune(ctx context.Context, res Resolution) {
	docs, err := r.store.Documents(ctx, res.Namespace)
	if err != nil {
		r.log.Warn("stats: prune", "namespace", res.Namespace, "err", err)
		return
	}
	oldest := res.BucketID(r.store.Now().Add(-res.Keep))
	for _, d := range docs {
		if d.ID >= oldest {
			continue
		}
		err := r.store.DeleteDocument(ctx, res.Namespace, d.ID, d.Version)
		if err != nil && !errors.Is(err, task.ErrNotFound) && !errors.Is(err, task.ErrConflict) {
			r.log.Warn("stats: prune", "namespace", res.Namespace, "bucket", d.ID, "err", err)
		}
	}
}

// Tee is an Observer telling each of obs (nil ones left out) of every
// event, in order.
func Tee(obs ...consumer.Observer) consumer.Observer {
	var t tee
	for _, o := range obs {
		if o != nil {
			t = append(t, o)
		}
	}
	return t
}

type tee []consumer.Observer

func (t tee) Claimed(e consumer.ClaimEvent) {
	for _, o := range t {
		o.Claimed(e)
	}
}

func (t tee) ClaimConflict(kind string) {
	for _, o := range t {
		o.ClaimConflict(kind)
	}
}

func (t tee) Finished(e consumer.FinishEvent) {
	for _, o := range t {
		o.Finished(e)
	}
}
