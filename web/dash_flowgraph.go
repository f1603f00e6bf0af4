package web

// The flow page's picture: the run's steps as a DAG and its attempts on a
// time line, both SVG drawn on the server (internal/flowgraph), coloured
// by the style sheet's fg-s-* and fg-o-* classes.

import (
	"context"
	"html/template"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/flowgraph"
	"github.com/leasepool/leasepool/task"
)

// flowPicture is the flow page's drawings.
type flowPicture struct {
	Graph    *flowgraph.Graph
	DAG      template.HTML
	Timeline template.HTML
	Legend   []flowgraph.State
	// Signals are the signal steps awaiting their signal.
	Signals []awaitingSignal
}

// awaitingSignal is a signal step the page offers to send.
type awaitingSignal struct {
	N          int // the step's index, for element ids
	Name       string
	Since, Due time.Time
}

// picture lays out f's current run and reads its step tasks' attempts.
func (d *dashboard) picture(ctx context.Context, f *flow.Flow) (flowPicture, error) {
	g := flowgraph.FromFlow(f, d.store.Now())
	tasks, err := d.stepTasks(ctx, f.Key, g.TaskKeys())
	if err != nil {
		return flowPicture{}, err
	}
	g.AddTasks(tasks)
	// Both drawings escape every name and text they hold (flowgraph's
	// tests parse them as XML with hostile names).
	p := flowPicture{Graph: g, DAG: template.HTML(g.SVG()), Timeline: template.HTML(g.Timeline()),
		Legend: flowgraph.States}
	if !f.State.Finished() {
		for i, nd := range g.Nodes {
			if nd.Type == string(flow.TypeSignal) && nd.State == flowgraph.Awaiting && !nd.Signalled {
				p.Signals = append(p.Signals, awaitingSignal{N: i, Name: nd.Name, Since: nd.Do.Start, Due: nd.Do.Due})
			}
		}
	}
	return p, nil
}

// stepTasks reads the tasks of keys, all under "key/", in one bounded
// list, newest first so the current run's come before older runs'; a
// task left out (crowded out by another flow's keys under the same
// prefix) is drawn from the flow's record alone.
func (d *dashboard) stepTasks(ctx context.Context, key string, keys []string) (map[string]*task.Task, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	ts, err := d.store.List(ctx, task.ListQuery{KeyPrefix: key + "/", Desc: true, Limit: 4*len(keys) + 16})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*task.Task, len(keys))
	for _, t := range ts {
		if want[t.Key] {
			out[t.Key] = t
		}
	}
	return out, nil
}
