// Device online state: the tracker fed by status messages, its mirror in
// shared storage, and the device listing of admin tools.

package mqttdev

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// DeviceState is what is known of a device's connection.
type DeviceState struct {
	ID     string `json:"id"`
	Online bool   `json:"online"`
	// At is the time the device put in its status message.
	At time.Time `json:"at"`
	// SeenAt is when a tracker received that message.
	SeenAt time.Time `json:"seen_at"`
	// Attributes are set only on the way to an AttributeStore: the
	// inventory keeps them, not the state record.
	Attributes Labels `json:"-"`
}

// DeviceStateStore mirrors device states in shared storage so every worker
// and admin tool sees the same picture. Implementations keep one record per
// device id and must be safe for concurrent use; several workers write the
// same state, so a put should keep the record with the later SeenAt.
type DeviceStateStore interface {
	PutDeviceState(ctx context.Context, s DeviceState) error
	DeviceStates(ctx context.Context) ([]DeviceState, error)
}

// AttributeStore keeps what devices announce of themselves (the device
// inventory, StoreInventory): a tracker given one (HandlerConfig.Inventory)
// writes every announcement that changed since it last saw the device's.
type AttributeStore interface {
	PutAttributes(ctx context.Context, id string, attrs Labels, at time.Time) error
}

// DeviceStates is what ListDevices needs of a tracker.
type DeviceStates interface {
	States() []DeviceState
}

// StateTracker keeps the latest status of every device, fed by the
// retained status messages on <prefix>/devices/+/status, and writes each
// change to a DeviceStateStore when one is given. Observe never blocks:
// store writes happen on the tracker's own goroutine (Start/Stop).
type StateTracker struct {
	store  DeviceStateStore
	inv    AttributeStore
	logger *slog.Logger

	life lifecycle.Runner

	mu     sync.Mutex
	states map[string]DeviceState
	dirty  map[string]DeviceState
	// attrs are the last attributes seen per device; announced, those
	// not yet written to the AttributeStore.
	attrs     map[string]Labels
	announced map[string]DeviceState
	// watch holds, per device, the channel closed at its next change of
	// online state: one for all who wait, however many commands do.
	watch map[string]chan struct{}
	kick  chan struct{}
}

// NewStateTracker returns an empty tracker; store and logger may be nil.
func NewStateTracker(store DeviceStateStore, logger *slog.Logger) *StateTracker {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &StateTracker{
		store:     store,
		logger:    logger,
		states:    map[string]DeviceState{},
		dirty:     map[string]DeviceState{},
		attrs:     map[string]Labels{},
		announced: map[string]DeviceState{},
		watch:     map[string]chan struct{}{},
		kick:      make(chan struct{}, 1),
	}
}

// Load fills the tracker from the store (states not seen yet here).
func (t *StateTracker) Load(ctx context.Context) error {
	if t.store == nil {
		return nil
	}
	states, err := t.store.DeviceStates(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range states {
		if cur, ok := t.states[s.ID]; !ok || cur.SeenAt.Before(s.SeenAt) {
			t.states[s.ID] = s
		}
	}
	return nil
}

// Start runs the store writer until Stop; without a store there is
// nothing to run. ctx's values are kept, its cancellation is not. A second
// call returns lifecycle.ErrStarted.
func (t *StateTracker) Start(ctx context.Context) error {
	run, err := t.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("device state tracker: %w", err)
	}
	if t.store != nil {
		t.life.Go(func() { t.writer(run) })
	}
	return nil
}

// Stop stops the writer after a last flush. It may be called again; ctx
// bounds the wait.
func (t *StateTracker) Stop(ctx context.Context) error { return t.life.Stop(ctx, nil) }

func (t *StateTracker) writer(ctx context.Context) {
	for {
		select {
		case <-t.kick:
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			t.flush(fctx)
			cancel()
			return
		}
		t.flush(ctx)
	}
}

// statusWriters is how many store writes a tracker's flush has in flight
// at once. Side by side, they share the store's group commits (SQLite
// commits a burst of connects in a few hundred commits rather than one
// per device); bounded, a burst of thousands of devices never holds more
// of the store's write queue than this, and the rest waits in the
// tracker's dirty set, where a device's newer status replaces its older
// one. Lease renewals go before document writes in the embedded store
// (a lane of their own), so they never wait behind these.
const statusWriters = 32

// flush writes what Observe marked dirty: every device's latest state,
// then the attributes announced, statusWriters at a time.
func (t *StateTracker) flush(ctx context.Context) {
	t.mu.Lock()
	batch := t.dirty
	t.dirty = map[string]DeviceState{}
	announced := t.announced
	t.announced = map[string]DeviceState{}
	t.mu.Unlock()
	var amu sync.Mutex // guards announced while the states are written
	forEach(batch, func(s DeviceState) {
		if err := t.putState(ctx, s, announced, &amu); err != nil {
			t.logger.Warn("device state not stored", slog.String("device", s.ID), slog.Any("error", err))
		}
	})
	forEach(announced, func(s DeviceState) {
		if err := t.inv.PutAttributes(ctx, s.ID, s.Attributes, s.SeenAt); err != nil {
			t.logger.Warn("device attributes not stored", slog.String("device", s.ID), slog.Any("error", err))
			t.mu.Lock()
			delete(t.attrs, s.ID) // the next announcement tries again
			t.mu.Unlock()
		}
	})
}

// forEach runs fn on every state of m, statusWriters at a time, and
// returns when all are done.
func forEach(m map[string]DeviceState, fn func(DeviceState)) {
	if len(m) == 1 {
		for _, s := range m {
			fn(s)
		}
		return
	}
	sem := make(chan struct{}, statusWriters)
	var wg sync.WaitGroup
	for _, s := range m {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(s)
		})
	}
	wg.Wait()
}

// putState stores s. When that creates the device's record, as after the
// device was forgotten (Forget), its entry went too: the attributes last
// seen, which an unchanged announcement would not write, are added to
// announced (guarded by amu) to be written again.
func (t *StateTracker) putState(ctx context.Context, s DeviceState, announced map[string]DeviceState, amu *sync.Mutex) error {
	sc, ok := t.store.(stateCreator)
	if !ok {
		return t.store.PutDeviceState(ctx, s)
	}
	created, err := sc.putDeviceState(ctx, s)
	if err != nil || !created || t.inv == nil {
		return err
	}
	amu.Lock()
	defer amu.Unlock()
	if _, queued := announced[s.ID]; queued {
		return nil
	}
	t.mu.Lock()
	attrs, seen := t.attrs[s.ID]
	t.mu.Unlock()
	if seen {
		a := s
		a.Attributes = attrs
		announced[s.ID] = a
	}
	return nil
}

// Observe records a status message of device id. An id ValidateID
// refuses is no device's: the message is dropped, nothing is stored.
func (t *StateTracker) Observe(id string, st Status, seenAt time.Time) {
	if err := ValidateID("device", id); err != nil {
		t.logger.Warn("device status dropped", slog.Any("error", err))
		return
	}
	s := DeviceState{ID: id, Online: st.Online, At: st.At.UTC(), SeenAt: seenAt.UTC()}
	if st.Attributes != nil {
		if err := st.Attributes.Validate("attributes"); err != nil {
			t.logger.Warn("device attributes dropped", slog.String("device", id), slog.Any("error", err))
			st.Attributes = nil
		}
	}
	t.mu.Lock()
	prev, had := t.states[id]
	t.states[id] = s
	if t.store != nil {
		t.dirty[id] = s
		if last, seen := t.attrs[id]; t.inv != nil && st.Attributes != nil && (!seen || !maps.Equal(last, st.Attributes)) {
			t.attrs[id] = st.Attributes
			a := s
			a.Attributes = st.Attributes
			t.announced[id] = a
		}
	}
	wake := t.watch[id]
	changed := !had || prev.Online != s.Online
	if changed {
		delete(t.watch, id)
	}
	t.mu.Unlock()
	if changed && wake != nil {
		close(wake)
	}
	if t.store != nil {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	if !had || prev.Online != s.Online {
		t.logger.Info("device status", slog.String("device", id), slog.Bool("online", s.Online))
	}
}

// State returns the state of device id, if any status was seen.
func (t *StateTracker) State(id string) (DeviceState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.states[id]
	return s, ok
}

// Offline reports whether device id is known to be offline. A device never
// heard of is not: its commands are sent and wait in its session.
func (t *StateTracker) Offline(id string) bool {
	s, ok := t.State(id)
	return ok && !s.Online
}

// Changed returns a channel closed at the next change of device id's
// online state.
func (t *StateTracker) Changed(id string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.watch[id]
	if c == nil {
		c = make(chan struct{})
		t.watch[id] = c
	}
	return c
}

// States returns every known state, by id.
func (t *StateTracker) States() []DeviceState {
	t.mu.Lock()
	out := make([]DeviceState, 0, len(t.states))
	for _, s := range t.states {
		out = append(out, s)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b DeviceState) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// DeviceInfo is one line of `leasepool devices`.
type DeviceInfo struct {
	ID string `json:"id"`
	// Known is false when no status was ever seen (only tasks name it).
	Known  bool      `json:"known"`
	Online bool      `json:"online"`
	At     time.Time `json:"at,omitzero"`
	// Current is the running command's task key, Command its name, and
	// Holder the worker running it with its attempt.
	Current string `json:"current,omitempty"`
	Command string `json:"command,omitempty"`
	Holder  string `json:"holder,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Queued is how many pending device tasks name this device.
	Queued int `json:"queued"`
	// Attributes are what the device announced of itself, Labels what an
	// operator set (Inventory): selectors tell them apart.
	Attributes Labels `json:"attributes,omitempty"`
	Labels     Labels `json:"labels,omitempty"`
	// New is true until someone vouches for the device (Vouch); Vouched
	// says who did.
	New     bool      `json:"new"`
	Vouched *Vouching `json:"vouched,omitempty"`
}

// ListDevices joins device states, the inventory and the device tasks in
// store: each device's online state, its announced attributes, operator
// labels and vouching, its running command and holder, and how many
// commands wait for it. states may be nil.
func ListDevices(ctx context.Context, store task.Store, states DeviceStates) ([]DeviceInfo, error) {
	infos := map[string]*DeviceInfo{}
	get := func(id string) *DeviceInfo {
		d, ok := infos[id]
		if !ok {
			d = &DeviceInfo{ID: id}
			infos[id] = d
		}
		return d
	}
	if states != nil {
		for _, s := range states.States() {
			d := get(s.ID)
			d.Known, d.Online, d.At = true, s.Online, s.At
		}
	}
	invs, err := Inventories(ctx, store)
	if err != nil {
		return nil, err
	}
	for id, inv := range invs {
		d := get(id)
		d.Attributes, d.Labels, d.Vouched = inv.Attributes, inv.Labels, inv.Vouched
	}
	now := store.Now()
	for _, st := range []task.State{task.StateRunning, task.StatePending} {
		var after int64
		for {
			page, err := store.List(ctx, task.ListQuery{State: st, Kind: Kind, AfterSeq: after, Limit: 500})
			if err != nil {
				return nil, err
			}
			for _, t := range page {
				after = t.Seq
				c, err := DecodePayload(t.Payload)
				if err != nil {
					continue // not ours to judge here
				}
				d := get(c.Device)
				if st == task.StatePending {
					d.Queued++
					continue
				}
				for _, w := range t.Attempts {
					if w.Live(now) || w.Expired(now) {
						d.Current, d.Command, d.Holder, d.Attempt = t.Key, c.Command, w.WorkerID, w.Attempt
					}
				}
			}
			if len(page) < 500 {
				break
			}
		}
	}
	out := make([]DeviceInfo, 0, len(infos))
	for _, d := range infos {
		d.New = d.Vouched == nil
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b DeviceInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// ReadStates connects with a throwaway session, collects the retained
// status messages under prefix for wait (they arrive at once on
// subscribe), and returns them in a tracker. It is for admin tools; workers
// use their Handler's Tracker. An empty cfg.ClientID with a user name
// means a throwaway one of that user's (broker.ClientID), as the embedded
// broker requires.
func ReadStates(ctx context.Context, cfg ClientConfig, prefix string, wait time.Duration) (*StateTracker, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if cfg.ClientID == "" && cfg.Username != "" {
		cfg.ClientID = broker.ClientID(cfg.Username, "states-"+NewCorrelationID()[:8])
	}
	if err := ValidateID("prefix", prefix); err != nil {
		return nil, err
	}
	topics := Topics{Prefix: prefix}
	tracker := NewStateTracker(nil, nil)
	tr, err := protocol.NewClient(cfg, protocol.ClientOptions{
		Role:         "admin",
		CleanSession: true,
		OnMessage: func(m Message) {
			id, kind, ok := topics.Parse(m.Topic)
			if !ok || kind != TopicStatus || len(m.Payload) == 0 {
				return
			}
			if st, err := DecodeStatus(m.Payload); err == nil {
				tracker.Observe(id, st, time.Now())
			}
		},
	})
	if err != nil {
		return nil, err
	}
	_ = tr.Subscribe(ctx, topics.All(TopicStatus))
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tr.Connect(cctx); err != nil {
		return nil, err
	}
	defer tr.Disconnect()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	return tracker, nil
}

// StateList serves device states read once, such as from the store.
type StateList []DeviceState

// States implements DeviceStates.
func (l StateList) States() []DeviceState { return l }

// StoredDevices is ListDevices with the online states the workers
// recorded in store (StoreStates): what `leasepool devices` and the web
// API show.
func StoredDevices(ctx context.Context, store task.Store) ([]DeviceInfo, error) {
	states, err := StoreStates(store).DeviceStates(ctx)
	if err != nil {
		return nil, err
	}
	return ListDevices(ctx, store, StateList(states))
}
