package rollout

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// A page of executions read from the rollout's document and the shards
// that hold it: across a shard boundary, past the end, and of one
// outcome, counted from the aggregates.
func TestDevicesPagesAcrossShards(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	n := 2*ShardSize + 3
	ids := devices(n)
	slices.Sort(ids) // the executions' order
	if _, err := Create(ctx, st, "paged", Spec{Command: "update", Devices: devices(n)}); err != nil {
		t.Fatal(err)
	}
	r, err := Get(ctx, st, "paged")
	if err != nil {
		t.Fatal(err)
	}
	// Three executions fail, one in each shard.
	for _, i := range []int{1, ShardSize + 1, 2 * ShardSize} {
		r.Devices[i].Outcome = OutcomeFailed
	}
	if err := put(ctx, st, r); err != nil {
		t.Fatal(err)
	}
	head, err := GetHead(ctx, st, "paged")
	if err != nil || head.Devices != nil || head.DeviceCount != n {
		t.Fatalf("head: %d devices loaded, count %d, %v", len(head.Devices), head.DeviceCount, err)
	}
	p, err := Devices(ctx, st, head, ShardSize-2, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(names(p.Devices)); p.Total != n || got != fmt.Sprint(ids[ShardSize-2:ShardSize+2]) {
		t.Fatalf("page across the boundary: total %d, %s", p.Total, got)
	}
	if p, err = Devices(ctx, st, head, n-1, 10, ""); err != nil || len(p.Devices) != 1 {
		t.Fatalf("the last page: %d devices, %v", len(p.Devices), err)
	}
	if p, err = Devices(ctx, st, head, 1, 10, OutcomeFailed); err != nil || p.Total != 3 ||
		fmt.Sprint(names(p.Devices)) != fmt.Sprint([]string{ids[ShardSize+1], ids[2*ShardSize]}) {
		t.Fatalf("failed from the second: total %d, %v, %v", p.Total, names(p.Devices), err)
	}
	if p, err = Devices(ctx, st, head, 0, 10, OutcomeQueued); err != nil || p.Total != n-3 || len(p.Devices) != 10 {
		t.Fatalf("queued: total %d, %d devices, %v", p.Total, len(p.Devices), err)
	}
}

func names(execs []Exec) []string {
	var out []string
	for _, e := range execs {
		out = append(out, e.Device)
	}
	return out
}
