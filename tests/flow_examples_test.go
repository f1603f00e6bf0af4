package tests

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// TestProvisioningExample runs examples/provisioning.json on a `leasepool
// worker` process: quota and IP at once, then create, then the approval
// sent with `leasepool flow signal` (a second refused), then bill, which
// sees every result before it.
func TestProvisioningExample(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	store, storeURL := openTestStore(t, ctx)
	cli := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, leasepoolBin(t), append([]string{"--store", storeURL}, args...)...).CombinedOutput()
		return string(out), err
	}
	startWorker(t, storeURL, "w1", "--kinds", "exec")
	if out, err := cli("flow", "publish", "vm-42", "--file", "../examples/provisioning.json"); err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	state := func(step string) flow.StepState {
		f, err := flow.Get(ctx, store, "vm-42")
		if err != nil {
			t.Fatal(err)
		}
		for i, st := range f.Steps {
			if st.Name == step {
				return f.Progress[i].State
			}
		}
		t.Fatalf("no step %s", step)
		return ""
	}
	eventually(t, time.Minute, "approval to wait for its signal", func() bool { return state("approval") == flow.StepRunning })
	if state("bill") != flow.StepWaiting {
		t.Fatalf("bill is %s before the approval", state("bill"))
	}
	if out, err := cli("flow", "signal", "vm-42", "approval", "--payload", `{"approved": true, "by": "ann"}`); err != nil {
		t.Fatalf("signal: %v\n%s", err, out)
	}
	// Refused as signalled already, or as finished: bill is a quick exec,
	// and the flow may have ended by now.
	if out, err := cli("flow", "signal", "vm-42", "approval", "--payload", `{"approved": false}`); err == nil ||
		!strings.Contains(out, "already signalled") && !strings.Contains(out, "flow finished") {
		t.Fatalf("second signal: %v\n%s", err, out)
	}
	f, err := waitFlow(ctx, store, "vm-42")
	if err != nil {
		t.Fatal(err)
	}
	var approval struct{ By string }
	if err := json.Unmarshal(f.Params["approval"], &approval); f.State != flow.StateSucceeded || err != nil || approval.By != "ann" {
		t.Fatalf("flow %s (%s), approval %s", f.State, f.Error, f.Params["approval"])
	}
	var ip struct{ IP string }
	var bill struct{ Invoice int }
	if json.Unmarshal(f.Params["ip"], &ip) != nil || ip.IP != "10.0.0.42" || json.Unmarshal(f.Params["bill"], &bill) != nil || bill.Invoice != 1 {
		t.Fatalf("results: ip %s, bill %s", f.Params["ip"], f.Params["bill"])
	}
	q, c := f.Progress[0].Do, f.Progress[2].Do
	if i := f.Progress[1].Do; c.StartedAt.Before(q.EndedAt) || c.StartedAt.Before(i.EndedAt) {
		t.Fatalf("create started %s, before quota (%s) and ip (%s) ended", c.StartedAt, q.EndedAt, i.EndedAt)
	}
}

func waitFlow(ctx context.Context, s task.Store, key string) (*flow.Flow, error) {
	for {
		f, err := flow.Get(ctx, s, key)
		if err != nil || f.State.Finished() {
			return f, err
		}
		select {
		case <-ctx.Done():
			return f, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
