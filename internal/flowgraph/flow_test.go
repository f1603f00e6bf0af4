package flowgraph

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

func TestFromFlow(t *testing.T) {
	f := &flow.Flow{Key: "prov", State: flow.StateRunning, Gen: 1, Steps: []flow.Step{
		{Name: "quota", Action: flow.Action{Kind: "exec"}},
		{Name: "ip", Action: flow.Action{Kind: "exec"}, Rollback: &flow.Action{Kind: "exec"}},
		{Name: "create", Needs: []string{"quota", "ip"}, Action: flow.Action{Kind: "exec"}},
		{Name: "approve", Type: flow.TypeSignal, Needs: []string{"create"}},
		{Name: "bill", Needs: []string{"approve"}, Action: flow.Action{Kind: "noop"}},
	}, Progress: []flow.Progress{
		{State: flow.StepSucceeded, Do: flow.Run{State: flow.RunSucceeded, Task: "prov/1/quota/do", StartedAt: t0, EndedAt: t0.Add(time.Second), Attempt: 1}},
		{State: flow.StepSucceeded, Do: flow.Run{State: flow.RunSucceeded, Task: "prov/2/ip/do", StartedAt: t0, EndedAt: t0.Add(2 * time.Second), Attempt: 3, Attempts: 3, Failures: 2}},
		{State: flow.StepSucceeded, Do: flow.Run{State: flow.RunSucceeded, StartedAt: t0.Add(2 * time.Second), EndedAt: t0.Add(3 * time.Second)}},
		{State: flow.StepRunning, Do: flow.Run{State: flow.RunActive, Task: "prov/4/approve/timer", StartedAt: t0.Add(3 * time.Second)}},
		{State: flow.StepWaiting},
	}}
	g := FromFlow(f, t0.Add(10*time.Second))
	if got := levelNames(g); !reflect.DeepEqual(got, [][]string{{"quota", "ip"}, {"create"}, {"approve"}, {"bill"}}) {
		t.Errorf("levels %v", got)
	}
	var states []State
	for _, nd := range g.Nodes {
		states = append(states, nd.State)
	}
	if want := []State{Succeeded, Succeeded, Succeeded, Awaiting, Waiting}; !reflect.DeepEqual(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	if g.Nodes[1].Do.Attempts != 3 || g.Nodes[0].Do.Attempts != 1 || g.Nodes[3].Type != "signal" || g.Nodes[3].Kind != "" {
		t.Errorf("nodes %+v", g.Nodes)
	}
	// The step task's attempts go on the time line; the signal step's
	// timer task does not.
	ip := &task.Task{Key: "prov/2/ip/do", History: []task.Attempt{
		{Attempt: 1, State: task.AttemptFail, StartedAt: t0, EndedAt: t0.Add(500 * time.Millisecond), Error: "no\nmore"},
		{Attempt: 2, State: task.AttemptExpired, StartedAt: t0.Add(600 * time.Millisecond)},
	}, Attempts: []task.Attempt{{Attempt: 3, State: task.AttemptSuccess, StartedAt: t0.Add(time.Second), EndedAt: t0.Add(2 * time.Second)}}}
	timer := &task.Task{Key: "prov/4/approve/timer", Attempts: []task.Attempt{{Attempt: 1, State: task.AttemptRunning, StartedAt: t0}}}
	g.AddTasks(map[string]*task.Task{ip.Key: ip, timer.Key: timer})
	var outcomes []string
	for _, sp := range g.Nodes[1].Do.Spans {
		outcomes = append(outcomes, sp.Outcome+":"+sp.Error)
	}
	if want := []string{"failed:no", "expired:", "succeeded:"}; !reflect.DeepEqual(outcomes, want) {
		t.Errorf("ip's spans %v, want %v", outcomes, want)
	}
	if len(g.Nodes[3].Do.Spans) != 0 || len(g.Nodes[3].Do.spans()) != 1 {
		t.Errorf("the signal step's spans %v: want one for its wait, none from its timer", g.Nodes[3].Do.Spans)
	}

	// A list with no needs named is a chain; a document with no recorded
	// step state is read from its runs.
	chain := &flow.Flow{Key: "c", Steps: []flow.Step{{Name: "a"}, {Name: "b", Rollback: &flow.Action{Kind: "x"}}, {Name: "c"}},
		Progress: []flow.Progress{
			{Do: flow.Run{State: flow.RunSucceeded}},
			{Do: flow.Run{State: flow.RunFailed, Failures: 2}, Undo: flow.Run{State: flow.RunActive, StartedAt: t0}},
			{},
		}}
	g = FromFlow(chain, t0)
	if got := levelNames(g); !reflect.DeepEqual(got, [][]string{{"a"}, {"b"}, {"c"}}) {
		t.Errorf("chain levels %v", got)
	}
	if g.Nodes[0].State != Succeeded || g.Nodes[1].State != RollingBack || g.Nodes[2].State != Waiting || g.Nodes[1].Do.Attempts != 2 {
		t.Errorf("chain states %s %s %s, attempts %d", g.Nodes[0].State, g.Nodes[1].State, g.Nodes[2].State, g.Nodes[1].Do.Attempts)
	}
	if !reflect.DeepEqual(g.Rollback, []int{1}) || g.Nodes[1].RollbackN != 1 {
		t.Errorf("rollback %v", g.Rollback)
	}

	// A sleep step waiting for its time is awaiting, its due time in the
	// hover text.
	due := t0.Add(10 * time.Minute)
	sleepy := &flow.Flow{Key: "s", Steps: []flow.Step{{Name: "cool-down", Sleep: task.Duration(10 * time.Minute)}},
		Progress: []flow.Progress{{State: flow.StepRunning, Do: flow.Run{State: flow.RunActive, Task: "s/1/cool-down/timer", StartedAt: t0, Due: due}}}}
	g = FromFlow(sleepy, t0.Add(time.Minute))
	if nd := g.Nodes[0]; nd.Type != "sleep" || nd.State != Awaiting || !strings.Contains(nd.describe(g.Now), "due 04:10:00.000") {
		t.Errorf("sleep step: type %s state %s, hover %q", nd.Type, nd.State, nd.describe(g.Now))
	}
}
