package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestListingsOverForgedDocuments: a document that does not decode in
// each namespace leasepool keeps its own state in fails no listing (the
// good entries beside it are listed), and a forged retention policy is a
// one-line error naming the document, which retention set replaces.
func TestListingsOverForgedDocuments(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("pause", "--kind", "slow")
	c.must("limit", "set", "--kind", "mail", "--rate", "5/m")
	c.must("schedule", "add", "nightly", "--every", "1h", "--kind", "noop")
	st, err := sqlitestore.Open(t.Context(), c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"leasepool.pause", "leasepool.limit", "leasepool.schedule", "leasepool.schedule-cursor", "leasepool.device-state", "leasepool.device-inventory"} {
		for _, id := range []string{"kind:forged", "nightly", "policy"} {
			if _, err := st.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: ns, ID: id + "-x", Value: json.RawMessage(`"forged"`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := st.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: "leasepool.retention", ID: "policy", Value: json.RawMessage(`{"succeeded":[]}`)}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pauses"}, "kind:slow"},
		{[]string{"limit", "ls"}, "kind:mail"},
		{[]string{"schedule", "ls"}, "nightly"},
		{[]string{"devices"}, ""},
	} {
		if out := c.must(tc.args...); !strings.Contains(out, tc.want) || strings.Contains(out, "forged") {
			t.Errorf("leasepool %v over forged documents:\n%s\nwant %q listed and nothing forged", tc.args, out, tc.want)
		}
	}
	_, err = c.run("retention", "show")
	if err == nil || !strings.Contains(err.Error(), "leasepool.retention/policy") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("retention show over a forged policy: %v; want a one-line error naming leasepool.retention/policy", err)
	}
	c.must("retention", "set", "--succeeded", "2h")
	if out := c.must("retention", "show"); !strings.HasPrefix(out, "succeeded 2h0m0s") {
		t.Errorf("retention show after set: %q", out)
	}
}
