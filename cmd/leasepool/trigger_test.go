package main

import (
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/trigger"
)

func TestTriggerAddLsPauseResumeRm(t *testing.T) {
	c, s := setupMongo(t)
	if err := s.Database().CreateCollection(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	coll := s.Database().Name() + ".orders"
	out := c.must("trigger", "add", "neworders", "--collection", coll, "--filter", `{"status": "new"}`,
		"--operations", "insert,update", "--fields", "status,customer.id", "--kind", "order", "--priority", "2", "--lock", "orders")
	if !strings.Contains(out, "added neworders (insert,update on "+coll) {
		t.Fatalf("add: %q", out)
	}
	var list []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(c.must("trigger", "ls", "--json")), &list); err != nil || len(list) != 1 {
		t.Fatalf("ls --json: %v %v", list, err)
	}
	var opts struct {
		Priority int      `json:"priority"`
		LockKeys []string `json:"lock_keys"`
	}
	if err := json.Unmarshal(list[0]["options"], &opts); err != nil || opts.Priority != 2 || len(opts.LockKeys) != 1 {
		t.Errorf("stored options %s (%v)", list[0]["options"], err)
	}
	var filter map[string]string
	if err := json.Unmarshal(list[0]["filter"], &filter); err != nil || filter["status"] != "new" || len(filter) != 1 {
		t.Errorf("stored filter %s (%v)", list[0]["filter"], err)
	}
	if out := c.must("trigger", "ls"); !strings.Contains(out, "neworders") || !strings.Contains(out, "active") {
		t.Errorf("ls: %q", out)
	}
	c.must("trigger", "pause", "neworders")
	if tr, err := trigger.Get(t.Context(), s, "neworders"); err != nil || !tr.Paused {
		t.Fatalf("after pause: %+v %v", tr, err)
	}
	c.must("trigger", "resume", "neworders")
	if tr, err := trigger.Get(t.Context(), s, "neworders"); err != nil || tr.Paused {
		t.Fatalf("after resume: %+v %v", tr, err)
	}
	c.must("trigger", "rm", "neworders")
	if _, err := c.run("trigger", "rm", "neworders"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("second rm: %v", err)
	}
}

// TestTriggerAddRefusesBadInput: each refusal is one line naming the flag,
// and nothing is written.
func TestTriggerAddRefusesBadInput(t *testing.T) {
	c, s := setupMongo(t)
	if err := s.Database().CreateCollection(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	db := s.Database().Name()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--collection", db + ".missing"}, "collection: " + db + ".missing does not exist"},
		{[]string{"--collection", db + ".tasks"}, "is leasepool's own"},
		{[]string{"--collection", db + ".documents"}, "is leasepool's own"},
		{[]string{"--collection", "nodot"}, "--collection"},
		{[]string{"--collection", db + ".orders", "--filter", `{"status":`}, "--filter: is not valid JSON"},
		{[]string{"--collection", db + ".orders", "--filter", `["x"]`}, "--filter: is not a JSON object"},
		{[]string{"--collection", db + ".orders", "--filter", `{"n": {"$gtt": 1}}`}, "filter.n: $gtt is not a query operator"},
		{[]string{"--collection", db + ".orders", "--filter", `{"$expr": {"$eq": [1, 1]}}`}, "filter: $expr is not a top-level operator"},
		{[]string{"--collection", db + ".orders", "--operations", "insert,upsert"}, "--operations"},
		{[]string{"--collection", db + ".orders", "--payload", "{}"}, "payload"},
		{[]string{"--filter", "{}"}, "--collection: required"},
	}
	for _, tc := range cases {
		args := append([]string{"trigger", "add", "bad"}, tc.args...)
		if !strings.Contains(strings.Join(tc.args, " "), "--kind") {
			args = append(args, "--kind", "order")
		}
		_, err := c.run(args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("leasepool %q: %v, want one line with %q", args, err, tc.want)
		}
	}
	if _, err := c.run("trigger", "add", "bad", "--collection", db+".orders", "--kind", "exec"); err == nil || !strings.Contains(err.Error(), "--kind") {
		t.Errorf("--kind exec: %v", err)
	}
	for _, ns := range []string{trigger.Namespace, trigger.PositionNamespace} {
		if docs, err := s.Documents(t.Context(), ns); err != nil || len(docs) != 0 {
			t.Errorf("%s after refused adds: %d documents (%v)", ns, len(docs), err)
		}
	}
}

// TestTriggerOnTable: on the embedded store, trigger add --table sets
// SQL triggers on the user's table; ls, pause, resume and rm work; a
// refusal is one line naming the flag, with nothing written.
func TestTriggerOnTable(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "--kind", "noop", "first") // makes the store's file
	db, err := sql.Open("sqlite", "file:"+c.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, total REAL)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ok", "--table", "missing"}, "--table: no table missing"},
		{[]string{"ok", "--table", "tasks"}, "--table: tasks is leasepool's"},
		{[]string{"ok", "--table", "orders; DROP TABLE orders"}, "--table: "},
		{[]string{"not-an-identifier", "--table", "orders"}, "NAME: "},
		{[]string{"ok", "--table", "orders", "--filter", `{"status":`}, "--filter: "},
		{[]string{"ok", "--table", "orders", "--filter", `{"state":"new"}`}, "--filter: table orders has no column state"},
		{[]string{"ok", "--table", "orders", "--operations", "replace"}, "--operations: "},
		{[]string{"ok", "--table", "orders", "--fields", "nope"}, "--fields: table orders has no column nope"},
		{[]string{"ok", "--table", "orders", "--collection", "a.b"}, "--table: give --collection"},
		{[]string{"ok", "--collection", "a.b"}, "collection: the embedded store has tables"},
	} {
		args := append(append([]string{"trigger", "add"}, tc.args...), "--kind", "order")
		_, err := c.run(args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("leasepool %q: %v, want one line with %q", args, err, tc.want)
		}
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' OR name LIKE 'leasepool_outbox%'`).Scan(&n)
	if n != 0 {
		t.Errorf("refused adds left %d SQL objects", n)
	}
	out := c.must("trigger", "add", "neworders", "--table", "orders", "--filter", `{"status": "new"}`, "--operations", "insert,delete",
		"--kind", "order", "--priority", "2")
	if !strings.Contains(out, "added neworders (insert,delete on table orders") {
		t.Fatalf("add: %q", out)
	}
	if out := c.must("trigger", "ls"); !strings.Contains(out, "table orders") || !strings.Contains(out, "active") {
		t.Errorf("ls: %q", out)
	}
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'`).Scan(&n)
	if n != 2 {
		t.Errorf("%d SQL triggers; want 2 (insert, delete)", n)
	}
	c.must("trigger", "pause", "neworders")
	if out := c.must("trigger", "ls"); !strings.Contains(out, "paused") {
		t.Errorf("ls after pause: %q", out)
	}
	c.must("trigger", "resume", "neworders")
	c.must("trigger", "rm", "neworders")
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'`).Scan(&n)
	if n != 0 {
		t.Errorf("%d SQL triggers after rm", n)
	}
}
