package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFlowShowLargeByLevels: flow show of a 313-step flow (a root, 12
// steps needing it, 25 leaves needing each) prints each level's counts
// and a page of 20 steps, not every step; --level and --page pick, and a
// level the flow lacks is refused naming the flag.
func TestFlowShowLargeByLevels(t *testing.T) {
	c := setup(t)
	steps := []string{`{"name":"root","kind":"noop"}`}
	for m := range 12 {
		steps = append(steps, fmt.Sprintf(`{"name":"m%d","kind":"noop","needs":["root"]}`, m))
	}
	for m := range 12 {
		for l := range 25 {
			steps = append(steps, fmt.Sprintf(`{"name":"l%d-%d","kind":"noop","needs":["m%d"]}`, m, l, m))
		}
	}
	file := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(file, []byte(`{"steps":[`+strings.Join(steps, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c.must("flow", "publish", "big", "--file", file)
	out := c.must("flow", "show", "big")
	for _, want := range []string{"flow big: running, 313 steps in 3 levels", "level 1: 1 steps: 1 running",
		"level 2: 12 steps: 12 waiting", "level 3: 300 steps: 300 waiting", "(page 1 of 15, failing steps first"} {
		if !strings.Contains(out, want) {
			t.Errorf("flow show lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n > 60 {
		t.Errorf("flow show printed %d lines for 313 steps:\n%s", n, out)
	}
	out = c.must("flow", "show", "big", "--level", "3", "--page", "15")
	if !strings.Contains(out, "l11-24") || strings.Contains(out, "level 2:") {
		t.Errorf("--level 3 --page 15 does not show level 3's last steps alone:\n%s", out)
	}
	var doc struct {
		Steps  int `json:"steps"`
		Levels []struct {
			Level int               `json:"level"`
			Steps int               `json:"steps"`
			Shown []json.RawMessage `json:"shown"`
		} `json:"levels"`
	}
	if err := json.Unmarshal([]byte(c.must("flow", "show", "big", "--json")), &doc); err != nil || doc.Steps != 313 ||
		len(doc.Levels) != 3 || doc.Levels[2].Steps != 300 || len(doc.Levels[2].Shown) != 20 {
		t.Errorf("flow show --json: %+v %v", doc, err)
	}
	if _, err := c.run("flow", "show", "big", "--level", "4"); err == nil || !strings.Contains(err.Error(), "level") {
		t.Errorf("--level 4: %v; want an error naming --level", err)
	}
	if out := c.must("flow", "show", "big", "--all"); !strings.Contains(out, "l11-24") || strings.Count(out, "\n") < 313 {
		t.Errorf("--all does not print every step")
	}
}
