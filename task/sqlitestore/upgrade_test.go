package sqlitestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// version3 is the schema of version 3 (before the retention index,
// changes.doc, the list indexes, lock_lines, updated_at and the partial
// claim indexes), with one finished task.
const version3 = `
CREATE TABLE tasks (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
	state TEXT NOT NULL, next_claim_at INTEGER NOT NULL, priority INTEGER NOT NULL, pinned TEXT NOT NULL,
	version INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE INDEX tasks_state_next_claim ON tasks (state, next_claim_at);
CREATE INDEX tasks_state_priority ON tasks (state, priority DESC, seq);
CREATE TABLE changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL);
CREATE TABLE records (kind TEXT NOT NULL, id TEXT NOT NULL, at INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (kind, id));
CREATE TABLE locks (key TEXT PRIMARY KEY, task_key TEXT NOT NULL, worker_id TEXT NOT NULL, attempt INTEGER NOT NULL,
	until INTEGER NOT NULL, instance TEXT NOT NULL DEFAULT '');
CREATE TABLE workers (id TEXT PRIMARY KEY, instance TEXT NOT NULL, until INTEGER NOT NULL, info TEXT NOT NULL);
INSERT INTO tasks (key, kind, state, next_claim_at, priority, pinned, version, doc) VALUES ('old', 'k', 'succeeded', 0, 0, '', 2,
	'{"key":"old","kind":"k","state":"succeeded","version":2,"updated_at":"2020-01-02T03:04:05.678Z","created_at":"2020-01-02T03:04:05Z"}');
INSERT INTO changes (seq, key) VALUES (41, 'old');
PRAGMA journal_mode = WAL;
PRAGMA user_version = 3;
`

// TestUpgradeFromVersion3 opens a store of schema version 3: read-only
// opens read it as it is, a writer upgrades it to the current schema, and
// the upgrade carries each task's age to the updated_at column (to the
// millisecond), and change seqs go on from the last one kept after the
// changes table loses its AUTOINCREMENT (version 9).
func TestUpgradeFromVersion3(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(version3); err != nil {
		t.Fatal(err)
	}
	ro, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 3 store: %v", err)
	}
	// The list queries only run faster with version 6's indexes.
	if ts, err := ro.List(t.Context(), task.ListQuery{Kind: "k", Desc: true, Limit: 5}); err != nil || len(ts) != 1 {
		t.Errorf("List on a version 3 store: %d tasks, %v", len(ts), err)
	}
	if _, err := ro.Stats(t.Context()); err != nil {
		t.Errorf("Stats on a version 3 store: %v", err)
	}
	ro.Close()
	rw, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	var v, idx, docs, lines, autoinc int
	var updated int64
	for _, c := range []struct {
		q    string
		dest any
	}{
		{`PRAGMA user_version`, &v},
		{`SELECT count(*) FROM sqlite_master WHERE name IN ('tasks_state_seq', 'tasks_kind_seq', 'tasks_kind_state_seq',
			'tasks_due', 'tasks_ready', 'tasks_finished_updated')`, &idx},
		{`SELECT count(*) FROM pragma_table_info('changes') WHERE name = 'doc'`, &docs},
		{`SELECT count(*) FROM sqlite_master WHERE name = 'lock_lines'`, &lines},
		{`SELECT updated_at FROM tasks WHERE key = 'old'`, &updated},
		{`SELECT count(*) FROM sqlite_master WHERE name = 'changes' AND sql LIKE '%AUTOINCREMENT%'`, &autoinc},
	} {
		if err := db.QueryRow(c.q).Scan(c.dest); err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
	}
	want := time.Date(2020, 1, 2, 3, 4, 5, 678e6, time.UTC).UnixNano()
	if v != sqlitestore.SchemaVersion || idx != 4 || docs != 1 || lines != 1 || updated != want || autoinc != 0 {
		t.Errorf("after a writer's open: version %d, indexes %d, changes.doc %d, lock_lines %d, updated_at %d, changes with AUTOINCREMENT %d; want %d, 4 (no tasks_due, no tasks_kind_state_seq), 1, 1, %d, 0",
			v, idx, docs, lines, updated, autoinc, sqlitestore.SchemaVersion, want)
	}
	if _, _, err := rw.Insert(t.Context(), &task.Task{Key: "new", Kind: "k", State: task.StatePending}); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	rows, err := db.Query(`SELECT seq FROM changes ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		rows.Scan(&seq)
		seqs = append(seqs, seq)
	}
	rows.Close()
	if len(seqs) != 2 || seqs[0] != 41 || seqs[1] != 42 {
		t.Errorf("change seqs after the upgrade and one insert: %v; want [41 42]", seqs)
	}
	// task_counts starts from the tasks there and goes on from the writes.
	st, err := rw.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []task.StateCount{{State: task.StatePending, Kind: "k", N: 1}, {State: task.StateSucceeded, Kind: "k", N: 1}}; !sameCounts(st.Counts, want) {
		t.Errorf("Stats after the upgrade and one insert: %v; want %v", st.Counts, want)
	}
	n, err := rw.DeleteFinished(t.Context(), task.DeleteParams{State: task.StateSucceeded, Before: time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC), Limit: 10})
	if err != nil || n != 1 {
		t.Errorf("retention on the upgraded store deleted %d, %v; want the old task", n, err)
	}
}

// TestWritesStopAfterANewerUpgrade: a process whose store file a newer
// program upgraded since it opened it writes nothing more (its writes
// would not keep what the newer schema keeps), and says why.
func TestWritesStopAfterANewerUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := task.Publish(t.Context(), s, task.PublishParams{Key: "before", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`PRAGMA user_version = 99`); err != nil {
		t.Fatal(err)
	}
	_, _, err = task.Publish(t.Context(), s, task.PublishParams{Key: "after", Kind: "k"})
	if !errors.Is(err, sqlitestore.ErrSchemaChanged) {
		t.Fatalf("publish after a newer program's upgrade: %v; want ErrSchemaChanged", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM tasks WHERE key = 'after'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("tasks written after the upgrade: %d, %v; want 0", n, err)
	}
}

// TestUpgradeFromVersion9 opens testdata/v9.db, written by the program of
// schema version 9 (three pending tasks, a pause and a rate limit, which
// rang the control doorbell task), and checks the upgrade in place: the
// tasks, records and counts are kept, the doorbell task is deleted with
// its count, and documents are written and heard on the change stream.
func TestUpgradeFromVersion9(t *testing.T) {
	path := copyFixture(t, "v9.db")
	ro, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of a version 9 store: %v", err)
	}
	if docs, err := ro.Documents(t.Context(), "ns"); err != nil || len(docs) != 0 {
		t.Errorf("Documents on a version 9 store: %v, %v; want none", docs, err)
	}
	if _, err := ro.GetDocument(t.Context(), "ns", "d"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("GetDocument on a version 9 store: %v; want ErrNotFound", err)
	}
	ro.Close()

	st, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db := rawDB(t, path)
	var v, bell, bellCount int
	for _, c := range []struct {
		q    string
		dest any
	}{
		{`PRAGMA user_version`, &v},
		{`SELECT count(*) FROM tasks WHERE key = 'leasepool:control'`, &bell},
		{`SELECT COALESCE(SUM(n), 0) FROM task_counts WHERE kind = 'leasepool.control'`, &bellCount},
	} {
		if err := db.QueryRow(c.q).Scan(c.dest); err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
	}
	if v != sqlitestore.SchemaVersion || bell != 0 || bellCount != 0 {
		t.Errorf("after the upgrade: version %d, doorbell tasks %d, counted %d; want %d, 0, 0", v, bell, bellCount, sqlitestore.SchemaVersion)
	}
	for i := range 3 {
		tk, err := st.Get(t.Context(), fmt.Sprintf("job-%d", i))
		if err != nil || tk.State != task.StatePending || string(tk.Payload) != `{"n":1}` {
			t.Fatalf("job-%d after the upgrade: %+v, %v", i, tk, err)
		}
	}
	stats, err := st.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []task.StateCount{{State: task.StatePending, Kind: "k", N: 3}}; !sameCounts(stats.Counts, want) {
		t.Errorf("Stats after the upgrade: %v; want %v", stats.Counts, want)
	}
	ctl, err := control.Load(t.Context(), st)
	if err != nil || len(ctl.Pauses) != 1 || ctl.Pauses[0].Target != control.Kind("slow") ||
		len(ctl.Limits) != 1 || ctl.Limits[0].Target != control.Lock("device:*") {
		t.Fatalf("controls after the upgrade: %+v, %v; want the pause of kind slow and the limit of device:*", ctl, err)
	}

	cs, err := st.Watch(t.Context(), task.WatchParams{Documents: []string{"ns"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := st.PutDocument(t.Context(), task.Document{Namespace: "ns", ID: "job-0", Value: json.RawMessage(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := task.Publish(t.Context(), st, task.PublishParams{Key: "after", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ev, err := cs.Next(ctx)
	if err != nil || ev.Document == nil || ev.Document.ID != "job-0" || ev.Document.Version != 1 {
		t.Fatalf("first event after the upgrade: %+v, %v; want document ns/job-0", ev, err)
	}
	if ev, err = cs.Next(ctx); err != nil || ev.Key != "after" || ev.Task == nil || ev.Task.Kind != "k" {
		t.Fatalf("second event after the upgrade: %+v, %v; want task after", ev, err)
	}
	// A document named like a task leaves the task alone.
	if tk, err := st.Get(t.Context(), "job-0"); err != nil || tk.Version != 1 {
		t.Fatalf("job-0 after a document of that id: %+v, %v", tk, err)
	}
}
