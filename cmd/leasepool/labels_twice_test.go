package main

import (
	"strings"
	"testing"
)

// TestLabelGivenTwiceRefused: `device label ID k=a k=b` is refused naming
// k, not the last value kept; nothing is written.
func TestLabelGivenTwiceRefused(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "d1", "ring=a")
	before := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	_, err := c.run("device", "label", "d1", "ring=b", "ring=canary")
	if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), `label key "ring": is given twice`) {
		t.Errorf("label given twice: %v, want a bad input error naming ring", err)
	}
	after := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	for name, b := range before {
		if strings.HasSuffix(name, ".db") && after[name] != b {
			t.Errorf("%s changed by a refused label edit", name)
		}
	}
}
