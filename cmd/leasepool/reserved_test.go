package main

import (
	"database/sql"
	"strings"
	"testing"
)

// TestPublishRefusesReservedAndUnboundedInput: leasepool's own keys, keys
// that could take a rate-limit slot, nesting past 64 levels and times past
// the documented range: exit 2 with the field named, nothing written.
func TestPublishRefusesReservedAndUnboundedInput(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "ok", "--kind", "noop")
	deep := strings.Repeat("[", 1001) + strings.Repeat("]", 1001)
	flowFile := writeFile(t, `{"steps":[{"name":"a","kind":"noop"}]}`)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"publish", "leasepool:control", "--kind", "leasepool.control", "--rerun"},
			`key: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`},
		{[]string{"publish", "leasepool:flow:x", "--kind", "leasepool.flow", "--payload", `{"steps":7}`},
			`key: "leasepool:flow:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{[]string{"publish", "k", "--kind", "noop", "--payload", deep}, "payload: nested deeper than 64 levels"},
		{[]string{"publish", "k", "--kind", "noop", "--delay", "2000000h"}, "run_at: "},
		{[]string{"flow", "publish", "leasepool:x", "--file", flowFile},
			`key: "leasepool:x" is reserved (the leasepool: prefix is leasepool's own)`},
	} {
		_, stderr, code := runMain(t, "", append([]string{"--store", c.store}, tt.args...)...)
		if code != exitBadInput {
			t.Errorf("%v: exit status %d, want %d (stderr %q)", tt.args, code, exitBadInput, stderr)
			continue
		}
		if line := errorLine(t, stderr); !strings.Contains(line, tt.want) {
			t.Errorf("%v: error %q; want it to say %q", tt.args, line, tt.want)
		}
	}
	if n := c.count(); n != 1 {
		t.Errorf("%d tasks after refused publishes, want 1", n)
	}
}

// TestFlowLsSkipsCorruptDocument: a flow document corrupted in the SQLite
// file itself does not make flow ls fail; the other flows are listed.
func TestFlowLsSkipsCorruptDocument(t *testing.T) {
	t.Parallel()
	c := setup(t)
	file := writeFile(t, `{"steps":[{"name":"a","kind":"noop"}]}`)
	c.must("flow", "publish", "good", "--file", file)
	c.must("flow", "publish", "bad", "--file", file)
	db, err := sql.Open("sqlite", "file:"+c.path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(`UPDATE documents SET value = '{"steps":7,"progress":"x"}' WHERE namespace = 'leasepool.flow' AND id = 'bad'`)
	if n, _ := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("corrupt the flow document: %d rows, %v", n, err)
	}
	db.Close()
	for range 2 {
		out, stderr, code := runMain(t, "", "--store", c.store, "flow", "ls")
		if code != exitOK || !strings.Contains(out, "good") || strings.Contains(out, "bad") {
			t.Fatalf("flow ls over a corrupt document: status %d\n%s%s", code, out, stderr)
		}
	}
}
