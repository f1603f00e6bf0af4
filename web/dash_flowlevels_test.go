package web_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/web"
)

// TestLargeFlowPageByLevels: a flow of 1,213 steps (a root, 12 steps
// needing it, 100 leaves needing each) is shown by levels with their
// counts and a page of 50 of one level's steps, not drawn step by step;
// bad level and page values are refused naming the field.
func TestLargeFlowPageByLevels(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	act := flow.Action{Kind: "noop"}
	steps := []flow.Step{{Name: "root", Action: act}}
	for m := range 12 {
		steps = append(steps, flow.Step{Name: fmt.Sprintf("m%d", m), Needs: []string{"root"}, Action: act})
	}
	for m := range 12 {
		for l := range 100 {
			steps = append(steps, flow.Step{Name: fmt.Sprintf("l%d-%d", m, l), Needs: []string{fmt.Sprintf("m%d", m)}, Action: act})
		}
	}
	if _, _, err := flow.Publish(t.Context(), e.store, flow.Spec{Key: "big", Steps: steps}); err != nil {
		t.Fatal(err)
	}
	body := e.wantPage("/flow?key=big", 200, `id="flow-levels"`, `<span class="r-running">1 running</span>`,
		`<span class="r-waiting">12 waiting</span>`, `<span class="r-waiting">1200 waiting</span>`, "level 1, steps 1 to 1 of 1")
	if strings.Contains(body, `id="flow-graph"`) || strings.Count(body, "<tr") > 60 || len(body) > 100_000 {
		t.Errorf("the page of a large flow draws it step by step (%d bytes, %d rows)", len(body), strings.Count(body, "<tr"))
	}
	body = e.wantPage("/flow?key=big&level=3&page=2", 200, "level 3, steps 51 to 100 of 1200", `id="flow-level-prev"`, `id="flow-level-next"`)
	if n := strings.Count(body, "<bdi>l"); n != 50 {
		t.Errorf("level 3's page shows %d leaves; want 50", n)
	}
	e.wantPage("/flow?key=big&level=3&page=24", 200, "steps 1151 to 1200 of 1200")
	e.wantPage("/flow?key=big&level=4", 400, "level")
	e.wantPage("/flow?key=big&level=3&page=25", 400, "page")
	e.wantPage("/flow?key=big&page=x", 400, "page")
}
