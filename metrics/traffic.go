package metrics

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// maxCommandNames bounds the command label's values: names past it count
// as "other", so a driver that invents names cannot grow the series
// without end.
const maxCommandNames = 48

// StoreTraffic counts a process's MongoDB traffic from the driver's
// command monitor: commands by name (round trips), the bytes of each
// command sent and of each reply received, and the change events its
// change streams received (every event on the wire, before the worker
// leaves out the ones it does not need). Give Monitor to the store
// (store.Options.Monitor) and register the StoreTraffic on the registry
// served as /metrics. It exports nothing until the first command, so a
// process on an embedded store shows no MongoDB series.
//
// A command costs an uncontended read lock and a few atomic adds; a reply
// to getMore or aggregate also a lookup of its cursor.
type StoreTraffic struct {
	commands, bytes, events *prometheus.Desc

	mu     sync.RWMutex
	byName map[string]*commandCounts

	changeEvents atomic.Uint64

	// Change streams are told from other cursors by their cursor id,
	// learnt from the reply to the aggregate that opened them.
	cursorMu sync.Mutex
	opening  map[int64]struct{} // request ids of change stream aggregates
	streams  map[int64]struct{} // cursor ids of open change streams
}

type commandCounts struct {
	n, sent, received atomic.Uint64
}

// NewStoreTraffic makes an empty StoreTraffic.
func NewStoreTraffic() *StoreTraffic {
	return &StoreTraffic{
		commands: prometheus.NewDesc(namespace+"_store_commands_total",
			"Commands this process sent to MongoDB (round trips), by command name.", []string{"command"}, nil),
		bytes: prometheus.NewDesc(namespace+"_store_bytes_total",
			"Bytes of the commands this process sent to MongoDB and of the replies it received (BSON documents, "+
				"without the wire header), by command name and direction (sent, received).", []string{"command", "direction"}, nil),
		events: prometheus.NewDesc(namespace+"_store_change_events_total",
			"Change events this process's change streams received from MongoDB, each with its looked-up document, "+
				"including those the worker then leaves out (lease renewals).", nil, nil),
		byName:  map[string]*commandCounts{},
		opening: map[int64]struct{}{},
		streams: map[int64]struct{}{},
	}
}

// Monitor is the command monitor to install on the MongoDB client.
func (t *StoreTraffic) Monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: t.started, Succeeded: t.succeeded, Failed: t.failed}
}

func (t *StoreTraffic) counts(name string) *commandCounts {
	t.mu.RLock()
	c := t.byName[name]
	t.mu.RUnlock()
	if c != nil {
		return c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c = t.byName[name]; c != nil {
		return c
	}
	if len(t.byName) >= maxCommandNames {
		name = "other"
		if c = t.byName[name]; c != nil {
			return c
		}
	}
	c = &commandCounts{}
	t.byName[name] = c
	return c
}

func (t *StoreTraffic) started(_ context.Context, e *event.CommandStartedEvent) {
	c := t.counts(e.CommandName)
	c.n.Add(1)
	c.sent.Add(uint64(len(e.Command)))
	switch e.CommandName {
	case "aggregate":
		if isChangeStream(e.Command) {
			t.cursorMu.Lock()
			t.opening[e.RequestID] = struct{}{}
			t.cursorMu.Unlock()
		}
	case "killCursors":
		ids, ok := e.Command.Lookup("cursors").ArrayOK()
		if !ok {
			return
		}
		t.cursorMu.Lock()
		defer t.cursorMu.Unlock()
		for v := range arrayValues(bsoncore.Document(ids)) {
			if id, ok := v.Int64OK(); ok {
				delete(t.streams, id)
			}
		}
	}
}

func (t *StoreTraffic) succeeded(_ context.Context, e *event.CommandSucceededEvent) {
	t.counts(e.CommandName).received.Add(uint64(len(e.Reply)))
	var batch string
	switch e.CommandName {
	case "aggregate":
		batch = "firstBatch"
	case "getMore":
		batch = "nextBatch"
	default:
		return
	}
	cursor, ok := e.Reply.Lookup("cursor").DocumentOK()
	if !ok {
		t.forget(e.CommandName, e.RequestID)
		return
	}
	id, _ := cursor.Lookup("id").Int64OK()
	t.cursorMu.Lock()
	isStream := false
	if e.CommandName == "aggregate" {
		if _, isStream = t.opening[e.RequestID]; isStream {
			delete(t.opening, e.RequestID)
			if id != 0 {
				t.streams[id] = struct{}{}
			}
		}
	} else {
		_, isStream = t.streams[id]
	}
	t.cursorMu.Unlock()
	if !isStream {
		return
	}
	if arr, ok := cursor.Lookup(batch).ArrayOK(); ok {
		n := 0
		for range arrayValues(bsoncore.Document(arr)) {
			n++
		}
		t.changeEvents.Add(uint64(n))
	}
}

func (t *StoreTraffic) failed(_ context.Context, e *event.CommandFailedEvent) {
	t.forget(e.CommandName, e.RequestID)
}

// forget drops a change stream aggregate that opened no cursor.
func (t *StoreTraffic) forget(name string, requestID int64) {
	if name != "aggregate" {
		return
	}
	t.cursorMu.Lock()
	delete(t.opening, requestID)
	t.cursorMu.Unlock()
}

// isChangeStream reports whether an aggregate command's pipeline starts
// with $changeStream.
func isChangeStream(cmd bson.Raw) bool {
	pipeline, ok := cmd.Lookup("pipeline").ArrayOK()
	if !ok {
		return false
	}
	for v := range arrayValues(bsoncore.Document(pipeline)) {
		stage, ok := v.DocumentOK()
		if !ok {
			return false
		}
		_, err := stage.LookupErr("$changeStream")
		return err == nil
	}
	return false
}

// arrayValues yields the values of a BSON array without allocating.
func arrayValues(arr bsoncore.Document) func(yield func(bsoncore.Value) bool) {
	return func(yield func(bsoncore.Value) bool) {
		length, rem, ok := bsoncore.ReadLength(arr)
		if !ok || int(length) > len(arr) || length < 5 {
			return
		}
		rem = arr[4 : length-1]
		for len(rem) > 0 {
			var el bsoncore.Element
			if el, rem, ok = bsoncore.ReadElement(rem); !ok {
				return
			}
			if !yield(el.Value()) {
				return
			}
		}
	}
}

// Describe implements prometheus.Collector.
func (t *StoreTraffic) Describe(ch chan<- *prometheus.Desc) {
	ch <- t.commands
	ch <- t.bytes
	ch <- t.events
}

// Collect implements prometheus.Collector.
func (t *StoreTraffic) Collect(ch chan<- prometheus.Metric) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if len(t.byName) == 0 {
		return
	}
	for name, c := range t.byName {
		ch <- prometheus.MustNewConstMetric(t.commands, prometheus.CounterValue, float64(c.n.Load()), name)
		ch <- prometheus.MustNewConstMetric(t.bytes, prometheus.CounterValue, float64(c.sent.Load()), name, "sent")
		ch <- prometheus.MustNewConstMetric(t.bytes, prometheus.CounterValue, float64(c.received.Load()), name, "received")
	}
	ch <- prometheus.MustNewConstMetric(t.events, prometheus.CounterValue, float64(t.changeEvents.Load()))
}
