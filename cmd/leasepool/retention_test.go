package main

import (
	"os"
	"strings"
	"testing"
)

func TestRetentionCommands(t *testing.T) {
	c := setup(t)
	if _, err := c.run("retention", "set", "--failed", "1x"); err == nil || fileExists(c.path) {
		t.Errorf("bad input: %v; store file created: %v", err, fileExists(c.path))
	}
	if out := c.must("retention", "set", "--failed", "-1", "--succeeded", "2h"); out != "succeeded 2h0m0s, failed forever, cancelled 24h0m0s, device states 720h0m0s\n" {
		t.Errorf("retention set printed %q", out)
	}
	if out := c.must("retention", "show"); !strings.HasPrefix(out, "succeeded 2h0m0s, failed forever") {
		t.Errorf("retention show printed %q", out)
	}
	for _, bad := range [][]string{{"--succeeded", "0s"}, {"--cancelled", "-2h"}, {"--failed", "soon"}} {
		_, err := c.run(append([]string{"retention", "set"}, bad...)...)
		if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("retention set %v: %v, want a usage error naming %s", bad, err, bad[0])
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
