package web

// The Devices page as a fleet view: how many devices are online, offline
// or never seen, the fleet counted by each operator label and each
// announced attribute, and each device's last commands.

import (
	"cmp"
	"context"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/internal/safetext"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// lastCommandsShown is how many of its newest commands each device row
// shows; maxCommandsRead bounds the device tasks read to find them.
const (
	lastCommandsShown = 3
	maxCommandsRead   = 2000
)

// maxAttributeValues bounds the values one attribute's chart draws, the
// most common first.
const maxAttributeValues = 12

// fleetPage is the Devices page's data.
type fleetPage struct {
	Online, Offline, Unknown int
	States                   template.HTML
	// Labels and Attributes are the fleet counted by the values of each
	// operator label and each announced attribute.
	Labels, Attributes []attributeChart
	Devices            []fleetDevice
	// CommandsCapped says more device tasks exist than were read for the
	// last commands.
	CommandsCapped bool
}

type attributeChart struct {
	Name  string
	Chart template.HTML
}

// fleetDevice is one device's row.
type fleetDevice struct {
	mqttdev.DeviceInfo
	Last []lastCommand
}

// lastCommand is one of a device's newest commands.
type lastCommand struct {
	Key, Command string
	State        task.State
	At           time.Time
}

// storeStates serves the device states the workers recorded in the store.
type storeStates []mqttdev.DeviceState

func (s storeStates) States() []mqttdev.DeviceState { return s }

func (d *dashboard) devices(w http.ResponseWriter, r *http.Request) {
	p, err := d.readFleet(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "devices", "Devices", p)
}

func (d *dashboard) readFleet(ctx context.Context) (*fleetPage, error) {
	list, err := mqttdev.StoreStates(d.store).DeviceStates(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := mqttdev.ListDevices(ctx, d.store, storeStates(list))
	if err != nil {
		return nil, err
	}
	last, capped, err := d.lastCommands(ctx)
	if err != nil {
		return nil, err
	}
	p := &fleetPage{CommandsCapped: capped}
	labels := map[string]mqttdev.Labels{}
	attrs := map[string]mqttdev.Labels{}
	for _, in := range infos {
		switch {
		case !in.Known:
			p.Unknown++
		case in.Online:
			p.Online++
		default:
			p.Offline++
		}
		if len(in.Labels) > 0 {
			labels[in.ID] = in.Labels
		}
		if len(in.Attributes) > 0 {
			attrs[in.ID] = in.Attributes
		}
		p.Devices = append(p.Devices, fleetDevice{DeviceInfo: in, Last: last[in.ID]})
	}
	p.States = barList("fleet-states", "devices by state", []barItem{
		{Label: "online", N: p.Online, Class: "online"}, {Label: "offline", N: p.Offline, Class: "offline"},
		{Label: "never seen", N: p.Unknown, Class: "offline"}})
	p.Labels = valueCharts("fleet-label-", "label", labels)
	p.Attributes = valueCharts("fleet-attr-", "announced", attrs)
	return p, nil
}

// valueCharts counts the devices by the values of each key of sets, one
// chart per key, with ids idPrefix and the key's index.
func valueCharts(idPrefix, what string, sets map[string]mqttdev.Labels) []attributeChart {
	var out []attributeChart
	for i, name := range attributeNames(sets) {
		counts := map[string]int{}
		for _, a := range sets {
			if v, ok := a[name]; ok {
				// An SVG text has no <bdi>: what could reorder the
				// chart's labels is escaped.
				counts[safetext.Escape(v)]++
			}
		}
		out = append(out, attributeChart{Name: name,
			Chart: barList(idPrefix+strconv.Itoa(i), "devices by "+what+" "+safetext.Escape(name), topValues(counts))})
	}
	return out
}

// attributeNames are the attribute names any device has, sorted.
func attributeNames(attrs map[string]mqttdev.Labels) []string {
	seen := map[string]bool{}
	for _, a := range attrs {
		for k := range a {
			seen[k] = true
		}
	}
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// topValues are the most common values, at most maxAttributeValues, the
// rest summed as "other".
func topValues(counts map[string]int) []barItem {
	items := make([]barItem, 0, len(counts))
	for v, n := range counts {
		items = append(items, barItem{Label: v, N: n})
	}
	slices.SortFunc(items, func(a, b barItem) int { return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Label, b.Label)) })
	if len(items) > maxAttributeValues {
		rest := 0
		for _, it := range items[maxAttributeValues-1:] {
			rest += it.N
		}
		items = append(items[:maxAttributeValues-1], barItem{Label: "other values", N: rest, Class: "offline"})
	}
	return items
}

// lastCommands reads the newest device tasks (at most maxCommandsRead)
// and keeps each device's newest lastCommandsShown; capped says there
// were more tasks.
func (d *dashboard) lastCommands(ctx context.Context) (map[string][]lastCommand, bool, error) {
	const page = 500
	out := map[string][]lastCommand{}
	var before int64
	for read := 0; read < maxCommandsRead; read += page {
		list, err := d.store.List(ctx, task.ListQuery{Kind: mqttdev.Kind, Desc: true, BeforeSeq: before, Limit: page})
		if err != nil {
			return nil, false, err
		}
		for _, t := range list {
			var c mqttdev.Command
			if json.Unmarshal(t.Payload, &c) != nil || c.Device == "" || len(out[c.Device]) >= lastCommandsShown {
				continue
			}
			out[c.Device] = append(out[c.Device], lastCommand{Key: t.Key, Command: c.Command, State: t.State, At: t.UpdatedAt})
		}
		if len(list) < page {
			return out, false, nil
		}
		before = list[len(list)-1].Seq
	}
	return out, true, nil
}
