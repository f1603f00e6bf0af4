// Where a rollout's executions live: in shard documents of ShardSize
// executions each, beside the rollout's own document, which holds the
// aggregates counted from them and the version of each shard they were
// counted from.

package rollout

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/leasepool/leasepool/task"
)

// ShardNamespace is the task.Document namespace of the shards of
// executions; a shard's id is its rollout's ShardKey, '/', its index.
const ShardNamespace = "leasepool.rollout-shard"

// ShardSize is how many executions a shard holds (the last one fewer):
// Devices[i*ShardSize:(i+1)*ShardSize] is shard i.
const ShardSize = 500

// shardDoc is a shard as stored.
type shardDoc struct {
	Rollout string `json:"rollout"`
	Index   int    `json:"index"`
	Devices []Exec `json:"devices"`
}

func shardID(key string, i int) string { return key + "/" + itoa(i) }

func shardCount(devices int) int { return (devices + ShardSize - 1) / ShardSize }

// shard is shard i of devices.
func shard(devices []Exec, i int) []Exec {
	return devices[i*ShardSize : min((i+1)*ShardSize, len(devices))]
}

func newShardKey(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return name + "@" + hex.EncodeToString(b[:])
}

// GetHead returns the rollout named name without its executions
// (Devices is nil): its state, waves and aggregates, what the read model
// (Progress) needs, in one read of one document however many devices it
// has.
func GetHead(ctx context.Context, ds task.DocumentStore, name string) (*Rollout, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	d, err := ds.GetDocument(ctx, Namespace, name)
	if errors.Is(err, task.ErrNotFound) {
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return decode(d)
}

// shardCache is what a reader keeps of a rollout's executions between
// reads: as of the shard versions it read or wrote, with each shard's
// fingerprint.
type shardCache struct {
	key      string
	versions []int64
	sums     []uint64
	all      []Exec
}

// load reads r's executions: from c when it holds every shard at the
// version r names (r.Devices is then c's, changed in place: a caller
// whose write fails drops c), else each shard c holds at that version
// from c and every other from the store. A shard stored at a later
// version than the rollout's document counted (a writer that stopped
// between its shard and its rollout writes) is taken as stored and marks
// r stale: its aggregates are counted again at its next write.
func load(ctx context.Context, ds task.DocumentStore, r *Rollout, c *shardCache) error {
	if r.ShardKey == "" {
		return nil // a rollout stored before shards: its executions came with it
	}
	if c != nil && c.key != r.ShardKey {
		c = nil
	}
	if c != nil && slices.Equal(c.versions, r.Shards) && len(c.all) == r.DeviceCount {
		r.Devices, r.sums = c.all, slices.Clone(c.sums)
		return nil
	}
	r.sums = make([]uint64, len(r.Shards))
	r.Devices = make([]Exec, 0, r.DeviceCount)
	var buf []Exec // each shard decoded into the same array, then copied
	for i, v := range r.Shards {
		if c != nil && i < len(c.versions) && c.versions[i] == v && i < len(c.sums) && i*ShardSize < len(c.all) {
			r.Devices = append(r.Devices, shard(c.all, i)...)
			r.sums[i] = c.sums[i]
			continue
		}
		d, err := ds.GetDocument(ctx, ShardNamespace, shardID(r.ShardKey, i))
		if err != nil {
			return fmt.Errorf("rollout %s shard %d: %w", r.Name, i, err)
		}
		// Cleared: Unmarshal decodes into the array's elements, leaving a
		// field the JSON leaves out as the previous shard had it.
		clear(buf[:cap(buf)])
		sd := shardDoc{Devices: buf[:0]}
		if err := json.Unmarshal(d.Value, &sd); err != nil {
			return fmt.Errorf("rollout %s shard %d: %w", r.Name, i, err)
		}
		buf = sd.Devices
		for j := range sd.Devices {
			// One string per outcome, not one per execution.
			if o := sd.Devices[j].Outcome; o != "" {
				if k := slices.Index(Outcomes, o); k >= 0 {
					sd.Devices[j].Outcome = Outcomes[k]
				}
			}
		}
		if d.Version != v {
			r.Shards[i], r.stale = d.Version, true
			if d.UpdatedAt.After(r.staleAt) {
				r.staleAt = d.UpdatedAt
			}
		}
		r.sums[i] = fingerprint(sd.Devices)
		r.Devices = append(r.Devices, sd.Devices...)
	}
	if len(r.Devices) != r.DeviceCount {
		return fmt.Errorf("rollout %s: %d executions in its shards, %d in its document", r.Name, len(r.Devices), r.DeviceCount)
	}
	return nil
}

// cache is what load needs to read r again without reading the shards
// it has not changed.
func (r *Rollout) cache() *shardCache {
	return &shardCache{key: r.ShardKey, versions: slices.Clone(r.Shards), sums: slices.Clone(r.sums), all: r.Devices}
}

// putShards writes the shards whose executions changed since read
// (r.sums), each by compare-and-set on its version, and counts the
// aggregates. A rollout stored before shards gets its shard key and every
// shard here.
func putShards(ctx context.Context, ds task.DocumentStore, r *Rollout) error {
	if r.ShardKey == "" {
		r.ShardKey, r.Shards, r.sums = newShardKey(r.Name), nil, nil
	}
	n := shardCount(len(r.Devices))
	for len(r.Shards) < n {
		r.Shards = append(r.Shards, 0)
	}
	for len(r.sums) < n {
		r.sums = append(r.sums, 0)
	}
	for i := range n {
		cur := shard(r.Devices, i)
		sum := fingerprint(cur)
		if r.Shards[i] > 0 && r.sums[i] == sum {
			continue
		}
		value, err := encodeJSON(shardDoc{Rollout: r.Name, Index: i, Devices: cur})
		if err != nil {
			return err
		}
		d, err := ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: ShardNamespace, ID: shardID(r.ShardKey, i), Version: r.Shards[i], Value: value})
		if err != nil {
			return fmt.Errorf("rollout %s shard %d: %w", r.Name, i, err)
		}
		r.Shards[i], r.sums[i] = d.Version, sum
	}
	r.stale = false
	r.tally()
	return nil
}

// seed keys the fingerprints, which are compared within a process only.
var seed = maphash.MakeSeed()

// fingerprint is a hash of every field of the executions.
func fingerprint(execs []Exec) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	var b [8]byte
	num := func(n int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(n))
		h.Write(b[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		h.WriteString(s)
	}
	for i := range execs {
		e := &execs[i]
		str(e.Device)
		str(string(e.Outcome))
		str(e.Error)
		str(string(e.Rollback))
		num(int64(e.Wave))
		num(int64(e.Attempt))
		num(int64(e.Lost))
		if e.Published {
			num(1)
		} else {
			num(0)
		}
		num(e.DispatchedAt.UnixNano())
		num(e.EndedAt.UnixNano())
		num(int64(len(e.Dispatched)))
		for _, t := range e.Dispatched {
			num(t.UnixNano())
		}
	}
	return h.Sum64()
}

// deleteShards deletes the shards of a rollout whose document is gone;
// one left by a crash is never read again (its key is the creation's).
func deleteShards(ctx context.Context, ds task.DocumentStore, r *Rollout) error {
	if r.ShardKey == "" {
		return nil
	}
	for i := range r.Shards {
		err := ds.DeleteDocument(task.WithInternalWrite(ctx), ShardNamespace, shardID(r.ShardKey, i), 0)
		if err != nil && !errors.Is(err, task.ErrNotFound) {
			return err
		}
	}
	return nil
}

// tally counts the aggregates from the executions.
func (r *Rollout) tally() {
	r.DeviceCount = len(r.Devices)
	r.RolledBack = Counts{}
	for w := range r.Waves {
		var c Counts
		lo, hi := min(max(r.Waves[w].Start, 0), len(r.Devices)), min(max(r.Waves[w].End, 0), len(r.Devices))
		for _, e := range r.Devices[lo:max(lo, hi)] {
			c.add(e.Outcome)
		}
		r.Waves[w].Counts = c
	}
	for _, e := range r.Devices {
		if e.Rollback != "" {
			r.RolledBack.add(e.Rollback)
		}
	}
}

// Page is one page of a rollout's executions, in wave then id order.
type Page struct {
	Offset  int    `json:"offset"`
	Total   int    `json:"total"`
	Devices []Exec `json:"devices"`
}

// Devices returns up to limit executions of rollout r (read by GetHead)
// from offset, reading only the shards that hold them; with outcome set,
// only executions of that outcome, counted from the offset among those
// (shards the aggregates show none of are skipped only by the wave
// counts: a shard is read when one of its waves holds that outcome).
func Devices(ctx context.Context, ds task.DocumentStore, r *Rollout, offset, limit int, outcome Outcome) (Page, error) {
	p := Page{Offset: offset, Total: r.DeviceCount, Devices: []Exec{}}
	if outcome != "" {
		p.Total = 0
		for _, w := range r.Waves {
			p.Total += w.Counts.Of(outcome)
		}
	}
	if limit <= 0 || offset < 0 || offset >= p.Total {
		return p, nil
	}
	read := func(i int) ([]Exec, error) {
		if r.Devices != nil {
			return shard(r.Devices, i), nil
		}
		d, err := ds.GetDocument(ctx, ShardNamespace, shardID(r.ShardKey, i))
		if err != nil {
			return nil, fmt.Errorf("rollout %s shard %d: %w", r.Name, i, err)
		}
		var sd shardDoc
		err = json.Unmarshal(d.Value, &sd)
		return sd.Devices, err
	}
	if outcome == "" {
		for i := offset / ShardSize; i < shardCount(r.DeviceCount) && len(p.Devices) < limit; i++ {
			execs, err := read(i)
			if err != nil {
				return p, err
			}
			from := max(offset-i*ShardSize, 0)
			for _, e := range execs[min(from, len(execs)):] {
				if len(p.Devices) == limit {
					break
				}
				p.Devices = append(p.Devices, e)
			}
		}
		return p, nil
	}
	skip := offset
	for i := 0; i < shardCount(r.DeviceCount) && len(p.Devices) < limit; i++ {
		lo, hi := i*ShardSize, min((i+1)*ShardSize, r.DeviceCount)
		has := false
		for _, w := range r.Waves {
			if w.Start < hi && w.End > lo && w.Counts.Of(outcome) > 0 {
				has = true
			}
		}
		if !has {
			continue
		}
		execs, err := read(i)
		if err != nil {
			return p, err
		}
		for _, e := range execs {
			if e.Outcome != outcome && !(outcome == OutcomeQueued && e.Outcome == "") {
				continue
			}
			if skip > 0 {
				skip--
				continue
			}
			if len(p.Devices) < limit {
				p.Devices = append(p.Devices, e)
			}
		}
	}
	return p, nil
}
