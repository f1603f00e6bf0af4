package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// htmlArgs is an args object of n bytes or a few less, all '<', '>' and
// '&' but for the key: what json.Marshal stores six times longer.
func htmlArgs(n int) json.RawMessage {
	return json.RawMessage(`{"a":"` + strings.Repeat("<>&", (n-8)/3) + `"}`)
}

func storedSize(t *testing.T, st task.Store, name string) int {
	t.Helper()
	d, err := st.GetDocument(context.Background(), Namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return len(d.Value)
}

// A rollout at the bounds of its document (args and rollback_args of
// 64 KiB of '<>&', the widest rate window, executions over three shards)
// is stored without HTML escapes, and then every execution, event and
// text driven to its longest, through the one write path every step
// takes, stays within MaxSize (its document), MaxShardSize (each shard)
// and the store's limit.
func TestStoredFormAndMaxSizeBoundEveryWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	args := htmlArgs(MaxArgsLen)
	spec := Spec{Command: "update", Args: args, Devices: devices(2*ShardSize + 7), Retries: MaxRetries,
		Rate: Rate{N: MaxRate, Per: task.Duration(time.Hour)}, RollbackCommand: "rollback", RollbackArgs: args}
	r, err := Create(ctx, st, "big", spec)
	if err != nil {
		t.Fatal(err)
	}
	d, err := st.GetDocument(ctx, Namespace, "big")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(d.Value, []byte(`\u003c`)) || !bytes.Contains(d.Value, args) {
		t.Fatalf("stored args are not the args as given (HTML-escaped?): %.200s", d.Value)
	}
	limit, err := r.MaxSize()
	if err != nil || limit > task.MaxDocumentSize {
		t.Fatalf("MaxSize of an accepted rollout = %d, %v: over the store's %d", limit, err, task.MaxDocumentSize)
	}
	t.Logf("created: %d bytes stored, at most %d over its life", len(d.Value), limit)

	// Everything that grows, at its worst: a device's error full of what
	// JSON escapes, far more dispatches than kept, the longest outcome,
	// the window full, every event's detail long.
	hostile := strings.Repeat("\"\\\x01\u2028<>&\xff", 200)
	far := time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)
	r.State, r.Reason = StateCancelling, hostile
	for i := range r.Devices {
		e := &r.Devices[i]
		e.Outcome, e.Rollback, e.Attempt, e.Lost, e.Published, e.Error = OutcomeTimedOut, OutcomeTimedOut, math.MaxInt, MaxLost, true, hostile
		e.DispatchedAt, e.EndedAt, e.Dispatched = far, far, nil
		for range 50 {
			e.Dispatched = append(e.Dispatched, far)
		}
	}
	for range MaxRate {
		r.Dispatches = append(r.Dispatches, far)
	}
	r.Rollback = &Rollback{Command: "rollback", StartedAt: far, EndedAt: far}
	for range 2 * MaxEvents {
		r.event(far, EventRollbackStarted, hostile)
	}
	r.EventSeq, r.CreatedAt, r.UpdatedAt, r.EndedAt = math.MaxInt64, far, far, far
	for i := range r.Waves {
		r.Waves[i].StartedAt, r.Waves[i].EndedAt, r.Waves[i].Approved, r.Waves[i].Stopped = far, far, true, true
	}
	if err := put(ctx, st, r); err != nil {
		t.Fatalf("a write of the grown rollout: %v", err)
	}
	n := storedSize(t, st, "big")
	if n > limit {
		t.Fatalf("the grown rollout is %d bytes, over its MaxSize %d", n, limit)
	}
	shardLimit, err := r.MaxShardSize()
	if err != nil || shardLimit > task.MaxDocumentSize {
		t.Fatalf("MaxShardSize %d, %v", shardLimit, err)
	}
	if got := largestShard(t, st, r); got > shardLimit {
		t.Fatalf("a grown shard is %d bytes, over MaxShardSize %d", got, shardLimit)
	}
	got, err := Get(ctx, st, "big")
	if err != nil {
		t.Fatal(err)
	}
	if e := got.Devices[0]; len(e.Dispatched) != MaxDispatched || len(e.Error) > MaxErrorLen || strings.ContainsAny(e.Error, "\x01\u2028") {
		t.Fatalf("a device kept %d dispatches and error %q", len(e.Dispatched), e.Error)
	}
	t.Logf("grown to every bound: %d bytes", n)
}

// The largest rollout Create can be asked for (MaxDevices devices of the
// longest ids, of the character JSON stores in two bytes, args and
// rollback_args of MaxArgsLen of '<>&', MaxWaves waves) fits the store
// at every bound: its document and each of its shards.
func TestTheLargestRolloutFitsTheStore(t *testing.T) {
	r := &Rollout{Name: "huge", Spec: Spec{Command: "update", Args: htmlArgs(MaxArgsLen), RollbackCommand: "r", RollbackArgs: htmlArgs(MaxArgsLen),
		Rate: Rate{N: MaxRate, Per: task.Duration(time.Hour)}}}
	for i := range MaxDevices {
		r.Devices = append(r.Devices, Exec{Device: fmt.Sprintf("%06d", i) + strings.Repeat(`"`, 122)})
	}
	for i := range MaxWaves {
		r.Waves = append(r.Waves, Wave{Start: i * MaxDevices / MaxWaves, End: (i + 1) * MaxDevices / MaxWaves})
	}
	if err := r.checkSize(); err != nil {
		t.Fatalf("checkSize = %v", err)
	}
	head, err := r.MaxSize()
	if err != nil {
		t.Fatal(err)
	}
	shard, err := r.MaxShardSize()
	if err != nil {
		t.Fatal(err)
	}
	if most := task.MaxDocumentSize - SizeMargin; head > most || shard > most {
		t.Fatalf("document at most %d bytes, shard %d: over %d", head, shard, most)
	}
	t.Logf("document at most %d bytes, a shard at most %d, of the store's %d", head, shard, task.MaxDocumentSize)
}

// largestShard is the size of r's largest shard as stored.
func largestShard(t *testing.T, st task.DocumentStore, r *Rollout) int {
	t.Helper()
	most := 0
	for i := range r.Shards {
		d, err := st.GetDocument(context.Background(), ShardNamespace, shardID(r.ShardKey, i))
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, len(d.Value))
	}
	return most
}

// retry-failed, round after round on a device that always fails, keeps
// its document the same size once the dispatch history is full: the
// history is the last MaxDispatched, not one more time per round.
func TestRetryFailedRoundsDoNotGrowTheDocument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	newFleet(t, st, 1, map[string]bool{"dev-000": true}, nil, time.Millisecond)
	if _, err := Create(ctx, st, "again", Spec{Command: "update", Devices: devices(2), Args: htmlArgs(1 << 10)}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	now := st.Now().UTC()
	sizes := map[int]int{}
	const rounds = MaxDispatched + 6
	for round := 1; ; round++ {
		r := drive(t, s, "again", 30*time.Second)
		if e := r.Devices[0]; e.Outcome != OutcomeFailed || e.Attempt != round || len(e.Dispatched) != min(round, MaxDispatched) {
			t.Fatalf("round %d: dev-000 %+v", round, e)
		}
		// Its size, times aside (RFC 3339 drops trailing zeros).
		e := r.Devices[0]
		e.DispatchedAt, e.EndedAt = now, now
		for i := range e.Dispatched {
			e.Dispatched[i] = now
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		sizes[round] = len(b)
		if most, err := r.MaxSize(); err != nil || storedSize(t, st, "again") > most {
			t.Fatalf("round %d: %d bytes stored, over MaxSize %d (%v)", round, storedSize(t, st, "again"), most, err)
		}
		if round == rounds {
			break
		}
		if _, n, err := RetryFailed(ctx, st, "again"); err != nil || n != 1 {
			t.Fatalf("retry-failed: %d %v", n, err)
		}
	}
	// From round 10 on the attempt takes two digits: the same size.
	if sizes[rounds] != sizes[10] {
		t.Fatalf("dev-000's execution grew across retry-failed rounds: %v bytes", sizes)
	}
}

// legacyEncode is how a rollout's document was written by json.Marshal:
// '<', '>' and '&' escaped, six bytes each.
// Its executions were in it, under "devices".
func legacyEncode(t *testing.T, r *Rollout) []byte {
	t.Helper()
	b, err := json.Marshal(struct {
		*Rollout
		Devices []Exec `json:"devices"`
	}{r, r.Devices})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// legacyMaxDevices was MaxDevices while the executions lived in the
// rollout's document.
const legacyMaxDevices = 1000

// A document written HTML-escaped to just under the store's limit, which
// no write could grow without passing it: cancel takes effect, the
// driver records it cancelled, and the document shrinks to its stored
// form.
func TestCancelOfAWedgedLegacyRolloutTakesEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	now := st.Now().UTC()
	r := &Rollout{Name: "wedged", State: StateRunning, CreatedAt: now, UpdatedAt: now,
		Spec: Spec{Command: "update", Args: htmlArgs(MaxArgsLen), RollbackCommand: "update", RollbackArgs: htmlArgs(MaxArgsLen),
			Waves: []WaveTarget{{Percent: 100}}}, Waves: []Wave{{Target: WaveTarget{Percent: 100}, End: legacyMaxDevices, Gate: GateAuto, StartedAt: now}}}
	for _, d := range devices(legacyMaxDevices) {
		r.Devices = append(r.Devices, Exec{Device: d, Outcome: OutcomeQueued})
	}
	r.event(now, EventCreated, "")
	// Device errors full of '<' fill it to just under the limit.
	fail := func(i int) {
		e := &r.Devices[i]
		e.Outcome, e.Attempt, e.EndedAt, e.Error = OutcomeFailed, 1, now, strings.Repeat("<", 120)
	}
	base := len(legacyEncode(t, r))
	fail(0)
	each := len(legacyEncode(t, r)) - base
	n := (task.MaxDocumentSize - 1000 - base) / each
	for i := 1; i < n; i++ {
		fail(i)
	}
	// The last one's error tops it up to within 60 bytes of the limit.
	fail(n)
	r.Devices[n].Error = ""
	room := task.MaxDocumentSize - 60 - len(legacyEncode(t, r))
	r.Devices[n].Error = strings.Repeat("<", room/6)
	value := legacyEncode(t, r)
	if len(value) > task.MaxDocumentSize || len(value) < task.MaxDocumentSize-70 {
		t.Fatalf("the legacy document is %d bytes, want just under %d", len(value), task.MaxDocumentSize)
	}
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: "wedged", Value: value}); err != nil {
		t.Fatal(err)
	}
	// As json.Marshal wrote it, the cancel (and every step after) could
	// not be written.
	cancelled := *r
	cancelled.State, cancelled.Reason = StateCancelling, "cancelled by an operator"
	cancelled.event(now, EventCancelled, cancelled.Reason)
	if n := len(legacyEncode(t, &cancelled)); n <= task.MaxDocumentSize {
		t.Fatalf("the legacy document with the cancel is %d bytes: the test proves nothing", n)
	}
	if _, err := Cancel(ctx, st, "wedged"); err != nil {
		t.Fatalf("cancel of the wedged rollout: %v", err)
	}
	got := drive(t, NewStepper(st), "wedged", 30*time.Second)
	if got.State != StateCancelled || got.Progress().Total.Queued != 0 {
		t.Fatalf("state %s, %+v", got.State, got.Progress().Total)
	}
	if n := storedSize(t, st, "wedged"); n > len(value)/2 {
		t.Fatalf("stored %d bytes after the cancel, from %d HTML-escaped", n, len(value))
	}
	if !bytes.Equal(got.Spec.Args, htmlArgs(MaxArgsLen)) {
		t.Fatalf("args changed: %.80s", got.Spec.Args)
	}
}

// A document the store refuses to take at every write is stepped once,
// not five times a second, until it changes.
func TestDriverStepsARefusedRolloutOnceUntilItChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	now := st.Now().UTC()
	r := &Rollout{Name: "forged", State: StateRunning, CreatedAt: now, Spec: Spec{Command: "update"},
		Waves: []Wave{{Target: WaveTarget{Percent: 100}, End: 1, Gate: GateAuto}}, Devices: []Exec{{Device: "dev-000"}}}
	base := len(legacyEncode(t, r))
	r.Spec.Args = json.RawMessage(`{"a":"` + strings.Repeat("x", task.MaxDocumentSize-base-20) + `"}`)
	v := legacyEncode(t, r)
	d, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: "forged", Value: v})
	if err != nil {
		t.Fatal(err)
	}
	dr, err := NewDriver(DriverConfig{Store: st, WorkerID: "d1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := dr.Pass(ctx); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "document value") {
		t.Fatalf("first pass: %v, want the store's refusal", err)
	}
	if err := dr.Pass(ctx); err != nil {
		t.Fatalf("second pass on the same document: %v, want it left alone", err)
	}
	// Changed (here: made writable), it is stepped again.
	r.Spec.Args, r.Version = nil, d.Version
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: "forged", Version: d.Version, Value: legacyEncode(t, r)}); err != nil {
		t.Fatal(err)
	}
	if err := dr.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := Get(ctx, st, "forged"); err != nil || got.Waves[0].StartedAt.IsZero() {
		t.Fatalf("not stepped after the change: %+v %v", got, err)
	}
}

func TestUnescapeHTMLAndClip(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":"\u003cb\u003e \u0026 \u003C"}`: `{"a":"<b> & <"}`,
		`{"a":"\\u003c"}`:                     `{"a":"\\u003c"}`,
		`{"a":"\\\u003c\"\u00e9"}`:            `{"a":"\\<\"\u00e9"}`,
		`{"a":1}`:                             `{"a":1}`,
	} {
		if got := string(unescapeHTML(json.RawMessage(in))); got != want {
			t.Errorf("unescapeHTML(%s) = %s, want %s", in, got, want)
		}
	}
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{`a"b`, 2, `a`},
		{`a"b`, 3, `a"`},
		{"a\x01\u2028\xffé", 10, "a???é"},
		{"ééé", 5, "éé"},
	} {
		if got := clip(c.in, c.n); got != c.want {
			t.Errorf("clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// The largest rollout document Create accepts (32 waves, args and
// rollback_args of MaxArgsLen, the longest device list its spec keeps
// of long ids, the widest rate window), grown to every bound with every
// wave reopened by retry-failed, is cancelled: the write that records it
// cancelled, every running wave stopped, fits in the store.
func TestCancelAtTheSizeLimitStopsEveryWave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	var ids []string
	for i := range MaxSpecDevices {
		// Long ids, of the character JSON stores in two bytes.
		ids = append(ids, fmt.Sprintf("%04d", i)+strings.Repeat(`"`, 124))
	}
	var waves []WaveTarget
	for i := 1; i < MaxWaves; i++ {
		waves = append(waves, WaveTarget{Count: i})
	}
	waves = append(waves, WaveTarget{Percent: 100})
	spec := Spec{Command: "update", Args: htmlArgs(MaxArgsLen), RollbackCommand: "rollback", RollbackArgs: htmlArgs(MaxArgsLen),
		Devices: ids, Waves: waves, Rate: Rate{N: MaxRate, Per: task.Duration(time.Hour)}}
	r, err := Create(ctx, st, "edge", spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Waves) != MaxWaves {
		t.Fatalf("%d waves, want %d", len(r.Waves), MaxWaves)
	}
	// Every wave ran and was reopened by retry-failed; every execution,
	// event and text at its longest; then an operator cancelled it.
	far := time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)
	r.State, r.Reason, r.Wave = StateCancelling, strings.Repeat(`"`, MaxReasonLen/2), MaxWaves-1
	for i := range r.Waves {
		r.Waves[i].Approved, r.Waves[i].StartedAt = true, far
	}
	for i := range r.Devices {
		e := &r.Devices[i]
		e.Outcome, e.Attempt, e.Lost, e.Published, e.Error = OutcomeTimedOut, math.MaxInt, MaxLost, true, strings.Repeat(`"`, MaxErrorLen/2)
		e.DispatchedAt, e.EndedAt, e.Dispatched = far, far, nil
		for range MaxDispatched {
			e.Dispatched = append(e.Dispatched, far)
		}
	}
	for range MaxRate {
		r.Dispatches = append(r.Dispatches, far)
	}
	for range MaxEvents {
		r.event(far, EventRollbackStarted, strings.Repeat(`"`, MaxDetailLen/2))
	}
	for i := range r.Events {
		r.Events[i].Seq, r.Events[i].Version = math.MaxInt64-1, math.MaxInt64
	}
	r.EventSeq, r.CreatedAt, r.UpdatedAt = math.MaxInt64-1, far, far
	if err := put(ctx, st, r); err != nil {
		t.Fatalf("the grown rollout, cancelling: %v", err)
	}
	if err := NewStepper(st).Step(ctx, "edge"); err != nil {
		t.Fatalf("the step that records the cancel: %v", err)
	}
	got, err := Get(ctx, st, "edge")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateCancelled {
		t.Fatalf("state %s, want cancelled", got.State)
	}
	for i, w := range got.Waves {
		if !w.Stopped || w.EndedAt.IsZero() {
			t.Fatalf("wave %d: %+v, want stopped", i, w)
		}
	}
	most, err := got.MaxSize()
	if n := storedSize(t, st, "edge"); err != nil || n > most || n > task.MaxDocumentSize {
		t.Fatalf("cancelled: %d bytes stored, over MaxSize %d (%v)", n, most, err)
	}
	shardMost, err := got.MaxShardSize()
	if n := largestShard(t, st, got); err != nil || n > shardMost {
		t.Fatalf("cancelled: a shard of %d bytes, over MaxShardSize %d (%v)", n, shardMost, err)
	}
	t.Logf("cancelled: %d bytes stored, MaxSize %d, store limit %d", storedSize(t, st, "edge"), most, task.MaxDocumentSize)
}
