package mongostore

// batch.go sends concurrent Updates as one bulk write. Updates are queued
// by key on Config.UpdateStreams streams, each owned by one goroutine (an
// updater) that takes what is already waiting, up to maxUpdateBatch, and
// sends it as one `update` command with one statement per caller. A lone
// Update goes out at once as a plain updateOne. Streams let several
// batches be out at once; keying them keeps every write of one document in
// one stream, so the resolution below never meets a rival batch of its own
// process.
//
// Each caller still gets exactly its own outcome, although the server
// answers a multi-statement update with aggregate counts only (n matched).
// Every statement of a batch also sets write_token, a value unique to that
// statement (an ObjectID: time, process and counter), and matches at most
// one document (key is unique). So:
//
//   - n == statements: every statement applied.
//   - otherwise one find on the batch's keys reads version and write_token.
//     A document carrying a statement's token was written by that statement
//     (no other write sets that value), so it applied. Of the rest ("unsure"),
//     k = n - confirmed applied and were then written again before the find
//     (by another process, or a later statement of the same batch), which
//     replaced their token. k == 0: none of them applied, so each gets
//     ErrConflict (document there) or ErrNotFound (gone). k == len(unsure):
//     all applied. Anything between cannot be told apart; those callers get
//     errOutcomeUnknown, which is not a task sentinel and so is handled like
//     a lost connection (the caller re-reads), never as success or as a
//     definite conflict. It needs a second writer on a statement's document
//     within the round trip between the bulk write and the find, and another
//     statement of the same batch not matching.
//
// Statements carry no upsert, so a missing key is never inserted.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// maxUpdateBatch bounds one bulk write (the server's own limit is 100,000
// statements and 48 MB; the driver splits a batch over that anyway).
const maxUpdateBatch = 128

// tokenField is the per-statement token of batched updates.
const tokenField = "write_token"

// quietField is set, to the version written, by quiet writes only
// (task.Task.Quiet: lease renewals): see Store.watch.
const quietField = "quiet_version"

// errOutcomeUnknown: a batched update's document was rewritten before the
// batch could be resolved, and whether this write applied cannot be told.
var errOutcomeUnknown = errors.New("outcome unknown: the document was written again before its batch was resolved")

// updReq is one queued Update.
type updReq struct {
	ctx     context.Context
	key     string
	version int64
	fields  bson.D // the $set, version last
	done    chan error
}

// submitUpdate queues r and waits for its outcome, the caller's context, or
// Close, whichever comes first. A caller that stops waiting after its
// request was taken does not know the outcome, as with any store error.
func (s *Store) submitUpdate(r *updReq) error {
	r.done = make(chan error, 1)
	h := fnv.New32a()
	h.Write([]byte(r.key))
	select {
	case s.updqs[int(h.Sum32()%uint32(len(s.updqs)))] <- r:
	case <-r.ctx.Done():
		return fmt.Errorf("update %s: %w", r.key, r.ctx.Err())
	case <-s.bgDone:
		return fmt.Errorf("update %s: %w", r.key, task.ErrClosed)
	}
	select {
	case err := <-r.done:
		return err
	case <-r.ctx.Done():
		return fmt.Errorf("update %s: %w", r.key, r.ctx.Err())
	case <-s.bgDone:
		select {
		case err := <-r.done:
			return err
		default:
			return fmt.Errorf("update %s: %w", r.key, task.ErrClosed)
		}
	}
}

// updater sends queued updates in batches until bg ends (Close), then
// fails whatever is still queued with task.ErrClosed.
func (s *Store) updater(bg context.Context, q chan *updReq) {
	defer s.wg.Done()
	batch := make([]*updReq, 0, maxUpdateBatch)
	for {
		select {
		case <-bg.Done():
			s.failQueued(q)
			return
		case r := <-q:
			batch = append(batch[:0], r)
		}
	fill:
		for len(batch) < maxUpdateBatch {
			select {
			case r := <-q:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		if s.beforeSend != nil {
			s.beforeSend(len(batch))
		}
		if bg.Err() != nil { // Close wins over a batch not yet sent
			for _, r := range batch {
				r.done <- fmt.Errorf("update %s: %w", r.key, task.ErrClosed)
			}
			s.failQueued(q)
			return
		}
		s.sendUpdates(bg, batch)
		clear(batch)
	}
}

func (s *Store) failQueued(q chan *updReq) {
	for {
		select {
		case r := <-q:
			r.done <- fmt.Errorf("update %s: %w", r.key, task.ErrClosed)
		default:
			return
		}
	}
}

// sendUpdates answers every request of batch. Requests whose caller has
// already given up are answered without being sent, so a write cancelled
// while queued never applies.
func (s *Store) sendUpdates(bg context.Context, batch []*updReq) {
	live := batch[:0:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- fmt.Errorf("update %s: %w", r.key, err)
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(bg, live)
	defer cancel()
	var errs []error
	if len(live) == 1 {
		errs = []error{s.updateOne(ctx, live[0])}
	} else {
		errs = s.updateMany(ctx, live)
	}
	for i, r := range live {
		// A batch cut short by Close reports the store's closed error.
		if err := errs[i]; err != nil && bg.Err() != nil && errors.Is(err, context.Canceled) {
			errs[i] = fmt.Errorf("%w: %w", task.ErrClosed, err)
		}
		r.done <- errs[i]
	}
}

// batchContext lives until Close or until every caller of batch has
// stopped waiting (cancelled, or past its deadline).
func batchContext(bg context.Context, batch []*updReq) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(bg)
	var waiting atomic.Int64
	waiting.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, r := range batch {
		stops[i] = context.AfterFunc(r.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

func (r *updReq) filter() bson.D {
	return bson.D{{Key: "key", Value: r.key}, {Key: "version", Value: r.version}}
}

// updateOne is a lone update: updateOne, and on no match a count to tell a
// conflict from a missing key.
func (s *Store) updateOne(ctx context.Context, r *updReq) error {
	res, err := s.tasks.UpdateOne(ctx, r.filter(), bson.D{{Key: "$set", Value: r.fields}})
	if err != nil {
		return fmt.Errorf("update %s: %w", r.key, mapErr(err))
	}
	if res.MatchedCount == 1 {
		return nil
	}
	n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: "key", Value: r.key}})
	if err != nil {
		return fmt.Errorf("update %s: %w", r.key, mapErr(err))
	}
	return missingOrConflict(r, n > 0)
}

func missingOrConflict(r *updReq, exists bool) error {
	if !exists {
		return fmt.Errorf("update %s: %w", r.key, task.ErrNotFound)
	}
	return fmt.Errorf("update %s version %d: %w", r.key, r.version, task.ErrConflict)
}

// withToken returns fields with the token set just before version, which
// stays last (see versionFirst).
func withToken(fields bson.D, token string) bson.D {
	out := make(bson.D, 0, len(fields)+1)
	out = append(out, fields[:len(fields)-1]...)
	out = append(out, bson.E{Key: tokenField, Value: token})
	return append(out, fields[len(fields)-1])
}

// updateMany sends batch as one unordered bulk write and returns each
// statement's outcome (see the top of this file).
func (s *Store) updateMany(ctx context.Context, batch []*updReq) []error {
	models := make([]mongo.WriteModel, len(batch))
	tokens := make([]string, len(batch))
	for i, r := range batch {
		tokens[i] = bson.NewObjectID().Hex()
		models[i] = mongo.NewUpdateOneModel().SetFilter(r.filter()).
			SetUpdate(bson.D{{Key: "$set", Value: withToken(r.fields, tokens[i])}})
	}
	res, err := s.tasks.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	errs := make([]error, len(batch))
	var bwe mongo.BulkWriteException
	switch {
	case err == nil:
	case errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 && res != nil:
		// A statement with a write error did not apply; the others did
		// as res counts.
		for _, we := range bwe.WriteErrors {
			if we.Index >= 0 && we.Index < len(batch) {
				errs[we.Index] = fmt.Errorf("update %s: %w", batch[we.Index].key, mapErr(we))
			}
		}
	default:
		for i, r := range batch {
			errs[i] = fmt.Errorf("update %s: %w", r.key, mapErr(err))
		}
		return errs
	}
	var rest []int
	for i := range batch {
		if errs[i] == nil {
			rest = append(rest, i)
		}
	}
	if res.MatchedCount == int64(len(rest)) {
		return errs
	}
	s.resolve(ctx, batch, tokens, rest, res.MatchedCount, errs)
	return errs
}

// resolve sets errs for the statements in rest, of which matched applied.
func (s *Store) resolve(ctx context.Context, batch []*updReq, tokens []string, rest []int, matched int64, errs []error) {
	keys := make([]string, 0, len(rest))
	for _, i := range rest {
		keys = append(keys, batch[i].key)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	stored, err := s.tokens(ctx, keys)
	if err != nil {
		for _, i := range rest {
			errs[i] = fmt.Errorf("update %s: %w", batch[i].key, err)
		}
		return
	}
	judge(batch, tokens, rest, matched, stored, errs)
}

// judge sets errs for the statements in rest, of which matched applied,
// from the tokens stored now (by key; a key absent is gone).
func judge(batch []*updReq, tokens []string, rest []int, matched int64, stored map[string]string, errs []error) {
	var unsure []int
	for _, i := range rest {
		if tok, ok := stored[batch[i].key]; ok && tok == tokens[i] {
			matched-- // confirmed: its token is there
			continue
		}
		unsure = append(unsure, i)
	}
	for _, i := range unsure {
		r := batch[i]
		_, exists := stored[r.key]
		switch matched {
		case 0: // every applied statement is confirmed
			errs[i] = missingOrConflict(r, exists)
		case int64(len(unsure)): // every unsure one applied
		default:
			errs[i] = fmt.Errorf("update %s version %d: %w", r.key, r.version, errOutcomeUnknown)
		}
	}
}

// tokens reads the write_token of each existing key ("" when none).
func (s *Store) tokens(ctx context.Context, keys []string) (map[string]string, error) {
	cur, err := s.tasks.Find(ctx, bson.D{{Key: "key", Value: bson.D{{Key: "$in", Value: keys}}}},
		options.Find().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: tokenField, Value: 1}}))
	if err != nil {
		return nil, mapErr(err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	out := make(map[string]string, len(keys))
	for cur.Next(ctx) {
		var d struct {
			Key   string `bson:"key"`
			Token string `bson:"write_token"`
		}
		if err := cur.Decode(&d); err != nil {
			return nil, fmt.Errorf("decode %s: %w", tokenField, err)
		}
		out[d.Key] = d.Token
	}
	if err := cur.Err(); err != nil {
		return nil, mapErr(err)
	}
	return out, nil
}
