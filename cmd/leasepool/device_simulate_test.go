package main

import (
	"strings"
	"testing"
)

// TestSimulateFlags: each bad fleet flag is refused with an error naming
// it, before any device connects; a fleet that cannot connect gives up at
// --start-timeout, saying how many devices were up.
func TestSimulateFlags(t *testing.T) {
	t.Parallel()
	c := setup(t)
	sim := []string{"device", "simulate", "--mqtt", "tcp://127.0.0.1:1", "--duration", "1s"}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--first", "-1"}, "--first"},
		{[]string{"--outage-every", "-2"}, "--outage-every"},
		{[]string{"--outage-every", "10", "--outage-for", "0s"}, "--outage-for"},
		{[]string{"--outage-every", "10", "--outage-after", "-1s"}, "--outage-after"},
		{[]string{"--outage-every", "10", "--outage-spread", "-1s"}, "--outage-spread"},
		{[]string{"--succeed", ""}, "--succeed"},
		{[]string{"--start-timeout", "-1s"}, "--start-timeout"},
	} {
		_, err := c.run(append(sim, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("simulate %v = %v, want an error naming %s", tc.args, err, tc.flag)
		}
	}
	_, err := c.run(append(sim, "--count", "3", "--start-timeout", "1s")...)
	if err == nil || !strings.Contains(err.Error(), "devices not up within 1s (0 of 3 devices up)") {
		t.Errorf("simulate against no broker = %v, want given up at --start-timeout", err)
	}
}
