package trigger_test

// Table triggers on the embedded store: Add, List, Pause, Resume and
// Remove, and the runner publishing what the SQL triggers recorded.

import (
	"database/sql"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/trigger"
)

// sqliteWithTable is an embedded store with the user's table orders
// (id, status, amount), and the user's own connection to its file.
func sqliteWithTable(t *testing.T) (*sqlitestore.Store, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	st, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, amount INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return st, db
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// kindTasks returns the tasks of kind, by key.
func kindTasks(t *testing.T, st task.Store, kind string) map[string]*task.Task {
	t.Helper()
	ts, err := st.List(t.Context(), task.ListQuery{Kind: kind, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*task.Task{}
	for _, tk := range ts {
		out[tk.Key] = tk
	}
	return out
}

func TestTableTriggerPublishesEachMatchingChangeOnce(t *testing.T) {
	st, db := sqliteWithTable(t)
	added, err := trigger.Add(t.Context(), st, trigger.Trigger{Name: "big", Table: "orders", Filter: json.RawMessage(`{"status":"new"}`),
		Operations: []string{task.OpInsert, task.OpDelete}, Fields: []string{"id", "amount"}, Kind: "order",
		Options: task.Options{Priority: 3}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(added.Operations, []string{"insert", "delete"}) || added.Table != "orders" {
		t.Fatalf("added %+v", added)
	}
	if _, err := trigger.Add(t.Context(), st, trigger.Trigger{Name: "big", Table: "orders", Kind: "order"}, false); !errors.Is(err, trigger.ErrExists) {
		t.Fatalf("second Add: %v; want ErrExists", err)
	}
	exec(t, db, `INSERT INTO orders VALUES (1, 'new', 10), (2, 'old', 20), (3, 'new', 30)`)
	exec(t, db, `UPDATE orders SET amount = 11 WHERE id = 1`) // updates are not taken
	exec(t, db, `DELETE FROM orders WHERE id IN (2, 3)`)
	runRunner(t, st)
	testutil.Eventually(t, 20*time.Second, "three tasks", func() bool { return len(kindTasks(t, st, "order")) == 3 })
	got := kindTasks(t, st, "order")
	var payloads []string
	for k, tk := range got {
		if !strings.HasPrefix(k, "trigger:big:row:") || tk.Priority != 3 {
			t.Errorf("task %s priority %d", k, tk.Priority)
		}
		payloads = append(payloads, string(tk.Payload))
	}
	slices.Sort(payloads)
	if want := []string{`{"amount":10,"id":1}`, `{"amount":30,"id":3}`, `{"amount":30,"id":3}`}; !slices.Equal(payloads, want) {
		// json_object keeps the column order; compare as sets of fields.
		norm := func(ss []string) []string {
			var out []string
			for _, s := range ss {
				var v map[string]any
				json.Unmarshal([]byte(s), &v)
				b, _ := json.Marshal(v)
				out = append(out, string(b))
			}
			slices.Sort(out)
			return out
		}
		if !slices.Equal(norm(payloads), norm(want)) {
			t.Errorf("payloads %v; want %v", payloads, want)
		}
	}

	// Paused: changes wait in the outbox, and publish on resume.
	if _, err := trigger.Pause(t.Context(), st, "big"); err != nil {
		t.Fatal(err)
	}
	// Nothing publishes once Pause returned: each drain checks the
	// trigger's version in its own transaction.
	exec(t, db, `INSERT INTO orders VALUES (4, 'new', 40)`)
	testutil.Consistently(t, 500*time.Millisecond, "nothing published while paused", func() bool { return len(kindTasks(t, st, "order")) == 3 })
	if _, err := trigger.Resume(t.Context(), st, "big"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the change made while paused", func() bool { return len(kindTasks(t, st, "order")) == 4 })

	list, err := trigger.List(t.Context(), st)
	if err != nil || len(list) != 1 || list[0].Table != "orders" || list[0].Collection != "" {
		t.Fatalf("List: %+v %v", list, err)
	}
	if err := trigger.Remove(t.Context(), st, "big"); err != nil {
		t.Fatal(err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'`).Scan(&n)
	if n != 0 {
		t.Errorf("%d SQL triggers left after Remove", n)
	}
	exec(t, db, `INSERT INTO orders VALUES (5, 'new', 50)`)
	if err := trigger.Remove(t.Context(), st, "big"); !errors.Is(err, trigger.ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	testutil.Consistently(t, 300*time.Millisecond, "nothing after Remove", func() bool { return len(kindTasks(t, st, "order")) == 4 })
}

// A bad table trigger is refused naming the field, with nothing written.
func TestTableTriggerRefusesBadInput(t *testing.T) {
	st, db := sqliteWithTable(t)
	for _, c := range []struct {
		tr    trigger.Trigger
		field string
	}{
		{trigger.Trigger{Name: "a", Table: "nope", Kind: "k"}, "table:"},
		{trigger.Trigger{Name: "a", Table: "tasks", Kind: "k"}, "table:"},
		{trigger.Trigger{Name: "a", Table: "or ders", Kind: "k"}, "table:"},
		{trigger.Trigger{Name: "a.b", Table: "orders", Kind: "k"}, "name:"},
		{trigger.Trigger{Name: "a", Table: "orders", Kind: "k", Filter: json.RawMessage(`{"status":`)}, "filter:"},
		{trigger.Trigger{Name: "a", Table: "orders", Kind: "k", Filter: json.RawMessage(`{"nope":1}`)}, "filter:"},
		{trigger.Trigger{Name: "a", Table: "orders", Kind: "k", Operations: []string{"replace"}}, "operations:"},
		{trigger.Trigger{Name: "a", Table: "orders", Kind: "k", VersionField: "v"}, "version_field:"},
		{trigger.Trigger{Name: "a", Table: "orders", Collection: "d.c", Kind: "k"}, "collection:"},
		{trigger.Trigger{Name: "a", Table: "orders"}, "kind:"},
		{trigger.Trigger{Name: "a", Collection: "d.c", Kind: "k"}, "collection:"},
	} {
		_, err := trigger.Add(t.Context(), st, c.tr, false)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v; want invalid naming %s", c.tr, err, c.field)
		}
	}
	if list, err := trigger.List(t.Context(), st); err != nil || len(list) != 0 {
		t.Errorf("List after refusals: %+v %v", list, err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' OR name LIKE 'leasepool_outbox%'`).Scan(&n)
	if n != 0 {
		t.Errorf("refusals left %d SQL objects", n)
	}
	// A store without tables refuses a table trigger.
	_, err := trigger.Add(t.Context(), memstore.New(memstore.Config{}).Open(), trigger.Trigger{Name: "a", Table: "orders", Kind: "k"}, false)
	if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "table:") {
		t.Errorf("table trigger on memstore: %v", err)
	}
}
