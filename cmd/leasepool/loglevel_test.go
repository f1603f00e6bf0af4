package main

import (
	"io"
	"log/slog"
	"testing"
)

// TestDefaultLogLevel: without --log-level the commands that run until
// stopped log at info, every other at warn.
func TestDefaultLogLevel(t *testing.T) {
	t.Parallel()
	app := newApp(io.Discard, io.Discard)
	for _, c := range []struct {
		args []string
		want slog.Level
	}{
		{[]string{"worker", "--id", "w1"}, slog.LevelInfo},
		{[]string{"serve"}, slog.LevelInfo},
		{[]string{"device", "broker", "--listen", "127.0.0.1:0"}, slog.LevelInfo},
		{[]string{"device", "simulate", "--count", "3"}, slog.LevelInfo},
		{[]string{"device", "label", "d1", "site=x"}, slog.LevelWarn},
		{[]string{"device"}, slog.LevelWarn},
		{[]string{"publish", "--kind", "noop", "--", "worker"}, slog.LevelWarn},
		{[]string{"retention", "set", "--succeeded", "1h"}, slog.LevelWarn},
		{[]string{"demo"}, slog.LevelWarn},
		{[]string{"bench"}, slog.LevelWarn},
		{[]string{"no-such-command"}, slog.LevelWarn},
		{nil, slog.LevelWarn},
	} {
		if got := defaultLogLevel(app, c.args); got != c.want {
			t.Errorf("%q: %s, want %s", c.args, got, c.want)
		}
	}
}
