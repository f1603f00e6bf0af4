package tests

// Table triggers end to end on the embedded store: `leasepool trigger
// add --table`, a writer process changing the user's table through its
// own SQLite connections, and `leasepool worker` processes (the elected
// one publishes what the SQL triggers recorded) SIGKILLed and restarted.

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// readingTasks returns the tasks of kind reading-changed: how many, their
// payloads' (id, v) pairs with how many tasks carry each, and how many
// are of a row the filter excludes.
func readingTasks(t *testing.T, st *sqlitestore.Store) (n int, pairs map[string]int, unmatched int) {
	t.Helper()
	pairs = map[string]int{}
	all, err := st.List(t.Context(), task.ListQuery{Kind: "reading-changed"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range all {
		var row struct{ ID, Match, V int }
		if err := json.Unmarshal(tk.Payload, &row); err != nil {
			t.Fatalf("task %s payload %s: %v", tk.Key, tk.Payload, err)
		}
		if row.Match != 1 {
			unmatched++
		}
		pairs[fmt.Sprintf("%d/%d", row.ID, row.V)]++
	}
	return len(all), pairs, unmatched
}

// readingCount counts the tasks of kind reading-changed (kept by the
// writes: no document is read).
func readingCount(t *testing.T, st *sqlitestore.Store) int {
	t.Helper()
	stats, err := st.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range stats.Counts {
		if c.Kind == "reading-changed" {
			n += int(c.N)
		}
	}
	return n
}

// TestTableTriggerSurvivesKills: a writer process makes 5,000 changes
// (LEASEPOOL_TRIGGER_CHANGES) to the user's table, a quarter of them on
// rows the filter excludes, plus transactions it rolls back, while the
// worker publishing the trigger's changes is SIGKILLed 5 times at random
// points and a new one started: every matching change has exactly one
// task (each insert's and each update's row, once), none is of an
// excluded row or a rolled-back write, and the outbox ends empty.
func TestTableTriggerSurvivesKills(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	n := 5000 // LEASEPOOL_TRIGGER_CHANGES, when set
	if v := triggerChanges(t); v != 10_000 {
		n = v
	}
	dbPath := filepath.Join(t.TempDir(), "store.db")
	st, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	url := "sqlite:" + dbPath
	user, err := sql.Open("sqlite", "file:"+dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { user.Close() })
	if _, err := user.Exec(`CREATE TABLE readings (id INTEGER PRIMARY KEY, match INTEGER NOT NULL, v INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(leasepoolBin(t), "--store", url, "trigger", "add", "readings", "--table", "readings",
		"--filter", `{"match": 1}`, "--operations", "insert,update", "--kind", "reading-changed").CombinedOutput(); err != nil {
		t.Fatalf("trigger add: %v\n%s", err, out)
	}
	writer := exec.Command(buildBinary(t, "./testdata/sqlitewriter"), "-db", dbPath, "-n", strconv.Itoa(n))
	start := time.Now()
	w := startWorker(t, url, "trig-0", "--kinds", "noop")
	writerOut := make(chan error, 1)
	go func() {
		out, err := writer.CombinedOutput()
		if err == nil && !strings.Contains(string(out), fmt.Sprintf("done %d", n)) {
			err = fmt.Errorf("output %q", out)
		}
		writerOut <- err
	}()
	rows := n / 2
	matching := rows - (rows+3)/4 // rows whose id is not a multiple of 4
	expect := 2 * matching        // an insert and an update each
	const kills = 5
	for k := 1; k <= kills; k++ {
		at := k*expect/(kills+1) + rand.IntN(expect/(2*kills+2)+1) - expect/(4*kills+4)
		eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks published before kill %d", at, k), func() bool {
			return readingCount(t, st) >= at
		})
		w.kill(t)
		got := readingCount(t, st)
		t.Logf("kill %d at %d tasks (%s)", k, got, time.Since(start).Round(time.Millisecond))
		w = startWorker(t, url, fmt.Sprintf("trig-%d", k), "--kinds", "noop")
	}
	if err := <-writerOut; err != nil {
		t.Fatalf("writer: %v", err)
	}
	eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks", expect), func() bool { return readingCount(t, st) >= expect })
	var waiting int
	eventually(t, time.Minute, "the outbox drained", func() bool {
		return user.QueryRow(`SELECT count(*) FROM leasepool_outbox`).Scan(&waiting) == nil && waiting == 0
	})
	got, pairs, unmatched := readingTasks(t, st)
	t.Logf("%d changes, %d matching, %d tasks, in %s with %d kills", n, expect, got, time.Since(start).Round(time.Millisecond), kills)
	if got != expect || unmatched != 0 {
		t.Fatalf("%d tasks, %d of excluded rows; want %d, 0", got, unmatched, expect)
	}
	for id := range rows {
		for v := range 2 {
			want := 1
			if id%4 == 0 {
				want = 0
			}
			if c := pairs[fmt.Sprintf("%d/%d", id, v)]; c != want {
				t.Errorf("row %d at v=%d: %d tasks, want %d", id, v, c, want)
			}
		}
	}
	for p := range pairs {
		if id, _, _ := strings.Cut(p, "/"); len(id) >= 7 {
			t.Errorf("a task of a rolled-back write: %s", p)
		}
	}
}

// TestTableTriggerLag prints the change-to-publish lag of a table
// trigger (the task's created_at, stamped by the publishing worker, less
// the written_at the test put in the row; one host, one clock) at p50
// and p99, for inserts made one at a time, each after the previous one's
// task. It asserts only that every change published.
func TestTableTriggerLag(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	st, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	url := "sqlite:" + dbPath
	user, err := sql.Open("sqlite", "file:"+dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { user.Close() })
	if _, err := user.Exec(`CREATE TABLE readings (id INTEGER PRIMARY KEY, match INTEGER NOT NULL, v INTEGER NOT NULL, written_at INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(leasepoolBin(t), "--store", url, "trigger", "add", "readings", "--table", "readings",
		"--kind", "reading-changed").CombinedOutput(); err != nil {
		t.Fatalf("trigger add: %v\n%s", err, out)
	}
	startWorker(t, url, "lag-0", "--kinds", "noop")
	const single = 100
	for i := range single {
		if _, err := user.Exec(`INSERT INTO readings VALUES (?, 1, 0, ?)`, i, time.Now().UnixNano()); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, fmt.Sprintf("task %d", i+1), func() bool { return readingCount(t, st) == i+1 })
	}
	all, err := st.List(ctx, task.ListQuery{Kind: "reading-changed"})
	if err != nil {
		t.Fatal(err)
	}
	var lags []time.Duration
	for _, tk := range all {
		var row struct {
			WrittenAt int64 `json:"written_at"`
		}
		if err := json.Unmarshal(tk.Payload, &row); err != nil {
			t.Fatal(err)
		}
		lags = append(lags, tk.CreatedAt.Sub(time.Unix(0, row.WrittenAt)))
	}
	p50, p90, p99, mx := percentiles(lags)
	t.Logf("%d inserts one at a time: change to task p50 %s, p90 %s, p99 %s, max %s", len(lags), p50, p90, p99, mx)
}
