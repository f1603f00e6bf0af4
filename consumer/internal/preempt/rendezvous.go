package preempt

// Claim spreading: which of the live workers able to run a task tries to
// claim it first, and how long each other one stands by before it tries
// too. Every worker computes the same ranking on its own (rendezvous,
// highest-random-weight hashing of the task's share bucket over the worker
// ids), so about one claim attempt is made per task whatever the number of
// workers, with no coordination beyond the registry every worker already
// reads. Ranking buckets rather than keys lets a worker ask the store for
// the tasks it is preferred for (Share), so that W workers draining a
// long queue read each task about once between them.

import (
	"math"
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Spread is the stand-by rule: the worker of rank r (0 is preferred) may
// claim a task Step × min(r, MaxRank) after the task became claimable.
type Spread struct {
	// Step is the delay between ranks: longer than a claim's write plus
	// its change event reaching the next worker, so that the next one
	// sees the claim before it would try.
	Step time.Duration
	// MaxRank caps the delay at Step × MaxRank: a task whose first
	// MaxRank workers are busy, dead or slow is tried by all the others
	// then, so no task waits longer than that for its preferred worker.
	MaxRank int
}

// DefaultSpread stands by 20 ms a rank, at most 200 ms.
var DefaultSpread = Spread{Step: 20 * time.Millisecond, MaxRank: 10}

// Delay is how long the worker of rank r stands by.
func (s Spread) Delay(rank int) time.Duration {
	return s.Step * time.Duration(min(rank, s.MaxRank))
}

// Peer is one live worker process as the registry lists it.
type Peer struct {
	ID    string
	Kinds []string // empty: every kind
	// Weight is the worker's share of claims (its concurrency); a worker
	// of weight 2 is preferred for twice the tasks of one of weight 1.
	Weight int
	hash   uint64
}

// Peers is the live workers at one moment, as every worker of a cluster
// sees them alike once the registry has been read.
type Peers struct {
	list []Peer
}

// NewPeers keeps the workers in ws live at now (self always counts, even
// before its own registration is read back).
func NewPeers(ws []task.WorkerInfo, self task.WorkerInfo, now time.Time) *Peers {
	p := &Peers{}
	seen := false
	for _, w := range ws {
		if w.ID == self.ID {
			w, seen = self, true
		} else if !w.Live(now) {
			continue
		}
		p.list = append(p.list, newPeer(w))
	}
	if !seen {
		p.list = append(p.list, newPeer(self))
	}
	slices.SortFunc(p.list, func(a, b Peer) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return p
}

func newPeer(w task.WorkerInfo) Peer {
	return Peer{ID: w.ID, Kinds: slices.Clone(w.Kinds), Weight: max(w.Concurrency, 1), hash: hashString(w.ID)}
}

// SameMembers reports whether p and q list the same workers (their
// records may differ otherwise).
func (p *Peers) SameMembers(q *Peers) bool {
	if p.Len() != q.Len() {
		return false
	}
	for i := range p.Len() {
		if p.list[i].ID != q.list[i].ID {
			return false
		}
	}
	return true
}

// SameRanking reports whether p and q rank every task alike: the same
// workers with the same kinds and weights.
func (p *Peers) SameRanking(q *Peers) bool {
	if p.Len() != q.Len() {
		return false
	}
	for i := range p.Len() {
		a, b := &p.list[i], &q.list[i]
		if a.ID != b.ID || a.Weight != b.Weight || !slices.Equal(a.Kinds, b.Kinds) {
			return false
		}
	}
	return true
}

// Len is the number of live workers.
func (p *Peers) Len() int {
	if p == nil {
		return 0
	}
	return len(p.list)
}

// Rank returns self's place, from 0, in t's ranking over the workers that
// may run t (its kind, its pins), counting at most up to limit: a rank of
// limit or more is reported as limit. Every worker holding the same Peers
// gets a different rank for t, exactly one of them 0.
func (p *Peers) Rank(t *task.Task, self string, limit int) int {
	if p == nil || len(p.list) <= 1 || len(t.SpecificWorkerIDs) == 1 {
		return 0
	}
	kh := bucketHash(task.ShareBucket(t.Seq))
	i, ok := slices.BinarySearchFunc(p.list, self, func(a Peer, id string) int {
		switch {
		case a.ID < id:
			return -1
		case a.ID > id:
			return 1
		}
		return 0
	})
	var mine float64
	if ok {
		mine = score(kh, p.list[i])
	} else {
		mine = score(kh, Peer{ID: self, Weight: 1, hash: hashString(self)})
	}
	rank := 0
	for j := range p.list {
		q := &p.list[j]
		if (ok && j == i) || !t.Allows(q.ID) || (len(q.Kinds) > 0 && !slices.Contains(q.Kinds, t.Kind)) {
			continue
		}
		if s := score(kh, *q); s > mine || (s == mine && q.ID < self) {
			if rank++; rank >= limit {
				return limit
			}
		}
	}
	return rank
}

// Preferred returns the ID of t's preferred worker (the one of rank 0),
// and the IDs of all the live workers able to run t, in ID order; none
// when no live worker may run it.
func (p *Peers) Preferred(t *task.Task) (string, []string) {
	if p == nil {
		return "", nil
	}
	kh := bucketHash(task.ShareBucket(t.Seq))
	best, bestScore := "", 0.0
	var able []string
	for j := range p.list {
		q := &p.list[j]
		if !t.Allows(q.ID) || (len(q.Kinds) > 0 && !slices.Contains(q.Kinds, t.Kind)) {
			continue
		}
		able = append(able, q.ID)
		if s := score(kh, *q); best == "" || s > bestScore {
			best, bestScore = q.ID, s
		}
	}
	return best, able
}

// Share returns the share buckets (task.ShareBucket) whose tasks self may
// rank first for: those where it ranks first among the workers able to run
// every one of kinds (all kinds when empty), a superset of where it ranks
// first for any task of those kinds, since the workers able to run a given
// task are at least those. Pinned tasks rank by their pins and are read
// apart (task.CandidateQuery.Share). Nil when self is the only worker:
// everything is its share.
func (p *Peers) Share(self string, kinds []string) []int {
	var rivals []Peer
	me := Peer{ID: self, Weight: 1, hash: hashString(self)}
	for _, q := range p.list {
		switch {
		case q.ID == self:
			me = q
		case len(q.Kinds) == 0 || (len(kinds) > 0 && containsAll(q.Kinds, kinds)):
			rivals = append(rivals, q)
		}
	}
	if len(rivals) == 0 {
		return nil
	}
	var share []int
	for b := range task.ShareBuckets {
		kh := bucketHash(b)
		mine := score(kh, me)
		first := true
		for _, q := range rivals {
			if s := score(kh, q); s > mine || (s == mine && q.ID < self) {
				first = false
				break
			}
		}
		if first {
			share = append(share, b)
		}
	}
	return share
}

func containsAll(set, xs []string) bool {
	for _, x := range xs {
		if !slices.Contains(set, x) {
			return false
		}
	}
	return true
}

// bucketHash is share bucket b's rendezvous hash.
func bucketHash(b int) uint64 { return mix(uint64(b) + 0x9e3779b97f4a7c15) }

// score is the weighted rendezvous score of worker q for the bucket hashed
// to kh: weight / -ln(u), u uniform in (0, 1) from the pair's hash, so
// that each worker is the highest for a share of buckets proportional to
// its weight, and a worker leaving moves only the buckets it ranked first.
func score(kh uint64, q Peer) float64 {
	u := (float64(mix(kh^q.hash)>>11) + 0.5) / (1 << 53)
	return float64(q.Weight) / -math.Log(u)
}

// hashString is 64-bit FNV-1a: the same in every process, unlike the
// runtime's seeded hashes.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}

// mix is SplitMix64's finalizer: every input bit moves every output bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
