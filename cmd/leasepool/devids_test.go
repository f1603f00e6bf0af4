package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
)

// badDeviceIDs are refused at every entry of the CLI.
var badDeviceIDs = []string{" ", "a b", "..", ".", "dev\u202e1", "dev\x00", "dev\n", "dev\u200f", "dev\u2066", "dev\u00a0"}

// rawControls reports whether s holds a control or format character
// other than the newline and tab a listing is laid out with.
func rawControls(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool {
		return r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r))
	})
}

// TestBadDeviceIDsRefusedEverywhere: each refused id, as the device of a
// label edit, of a published device command and of a rollout, is a
// one-line bad input error naming the field, that prints no control or
// format character, and writes nothing.
func TestBadDeviceIDsRefusedEverywhere(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "d1", "model=x")
	before := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	for _, id := range badDeviceIDs {
		payload, _ := json.Marshal(map[string]string{"device": id, "command": "reboot"})
		for _, tc := range []struct {
			args  []string
			names string
		}{
			{[]string{"device", "label", id, "k=v"}, "device"},
			{[]string{"publish", "k1", "--kind", "device", "--payload", string(payload)}, "device"},
			{[]string{"rollout", "create", "r1", "--command", "u", "--devices", id}, "devices"},
			{[]string{"rollout", "create", "r1", "--command", "u", "--devices", "d1," + id}, "devices"},
		} {
			_, err := c.run(tc.args...)
			if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), tc.names) {
				t.Errorf("%q: %v (exit %d), want a bad input error naming %s", tc.args, err, exitStatus(err), tc.names)
				continue
			}
			if msg := err.Error(); rawControls(msg) || strings.Contains(msg, "\n") {
				t.Errorf("%q: error %q prints a control or format character", tc.args, msg)
			}
		}
	}
	after := dirState(t, strings.TrimSuffix(c.path, "x.db"))
	for name, b := range before {
		if strings.HasSuffix(name, ".db") && after[name] != b {
			t.Errorf("%s changed by refused commands", name)
		}
	}
}
