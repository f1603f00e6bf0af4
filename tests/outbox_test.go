package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// openSQLite opens the embedded store at path in this process, closed
// when t ends.
func openSQLite(t *testing.T, path string) *sqlitestore.Store {
	t.Helper()
	s, err := store.Open(t.Context(), "sqlite:"+path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st, ok := store.SQLite(s)
	if !ok {
		t.Fatalf("store.SQLite(%T): not an embedded store", s)
	}
	return st
}

// TestOutboxSurvivesSIGKILL SIGKILLs a producer at random points of 1,000
// "write a row and publish its task" transactions (outboxwriter, four at
// a time), restarting it until it wrote them all: afterwards every row
// has its task and every task its row.
func TestOutboxSurvivesSIGKILL(t *testing.T) {
	const orders, kills = 1000, 20
	bin := buildBinary(t, "./testdata/outboxwriter")
	path := filepath.Join(t.TempDir(), "outbox.db")
	st := openSQLite(t, path)
	ctx := testContext(t, 5*time.Minute)

	published := func() int64 {
		stats, err := st.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, c := range stats.Counts {
			if c.Kind == "ship" {
				n += c.N
			}
		}
		return n
	}
	start := func() (*exec.Cmd, *bytes.Buffer, chan error) {
		cmd := exec.Command(bin, "--store", "sqlite:"+path, "--n", fmt.Sprint(orders))
		cmd.Env = append(cmd.Environ(), "GORACE=atexit_sleep_ms=0")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		return cmd, &out, exited
	}

	killed := 0
	for killed < kills {
		// Kill once the producer has published a random number more
		// tasks: wherever its four transactions are then.
		target := published() + rand.Int64N(2*orders/kills) + 1
		cmd, out, exited := start()
		var exitErr error
		stopped := false
		eventually(t, time.Minute, fmt.Sprintf("%d tasks published", target), func() bool {
			select {
			case exitErr = <-exited:
				stopped = true
				return true
			default:
			}
			return published() >= target
		})
		if stopped {
			if exitErr != nil {
				t.Fatalf("outboxwriter failed: %v\n%s", exitErr, tail(out.String(), 2000))
			}
			break // it finished before this kill
		}
		cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		killed++
		t.Logf("kill %d at %d tasks", killed, published())
	}
	_, out, exited := start()
	if err := <-exited; err != nil {
		t.Fatalf("outboxwriter's last run: %v\n%s", err, tail(out.String(), 2000))
	}
	if killed < kills/2 {
		t.Errorf("only %d kills landed before the producer finished; want at least %d", killed, kills/2)
	}

	// Every row has its task and every task its row.
	rows := map[int]bool{}
	err := st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		r, err := tx.Query(`SELECT id FROM orders`)
		if err != nil {
			return err
		}
		defer r.Close()
		for r.Next() {
			var id int
			if err := r.Scan(&id); err != nil {
				return err
			}
			rows[id] = true
		}
		return r.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	tasks := map[int]bool{}
	for after := int64(0); ; {
		page, err := st.List(ctx, task.ListQuery{KeyPrefix: "order-", AfterSeq: after, Limit: 200})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, tk := range page {
			var p struct{ ID int }
			if err := json.Unmarshal(tk.Payload, &p); err != nil || tk.Key != fmt.Sprintf("order-%04d", p.ID) {
				t.Fatalf("task %s has payload %s", tk.Key, tk.Payload)
			}
			if tasks[p.ID] {
				t.Errorf("two tasks for order %d", p.ID)
			}
			tasks[p.ID] = true
			after = tk.Seq
		}
	}
	var rowOrphans, taskOrphans []int
	for id := range rows {
		if !tasks[id] {
			rowOrphans = append(rowOrphans, id)
		}
	}
	for id := range tasks {
		if !rows[id] {
			taskOrphans = append(taskOrphans, id)
		}
	}
	slices.Sort(rowOrphans)
	slices.Sort(taskOrphans)
	t.Logf("%d kills; %d rows, %d tasks; orphans: %d rows without a task, %d tasks without a row",
		killed, len(rows), len(tasks), len(rowOrphans), len(taskOrphans))
	if len(rows) != orders || len(tasks) != orders || len(rowOrphans) > 0 || len(taskOrphans) > 0 {
		t.Errorf("rows without a task %v, tasks without a row %v; want %d of each and no orphan", rowOrphans, taskOrphans, orders)
	}
	if n := published(); n != orders {
		t.Errorf("task counts say %d ship tasks; want %d", n, orders)
	}
}

// finishes records the attempts a consumer finished, by task kind.
type finishes struct {
	mu  sync.Mutex
	got map[string][]consumer.Outcome
}

func (f *finishes) Claimed(consumer.ClaimEvent) {}
func (f *finishes) ClaimConflict(string)        {}
func (f *finishes) Finished(e consumer.FinishEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.got == nil {
		f.got = map[string][]consumer.Outcome{}
	}
	f.got[e.Kind] = append(f.got[e.Kind], e.Outcome)
}

func (f *finishes) of(kind string) []consumer.Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]consumer.Outcome(nil), f.got[kind]...)
}

// TestOutboxHandlerFinishesInItsTransaction runs handlers that write
// their business row and finish their task in one transaction
// (Tx.Succeed): one that holds its lease commits both, and the worker
// writes no outcome after; one whose lease was taken over is refused with
// ErrLeaseLost, and its row is not written.
func TestOutboxHandlerFinishesInItsTransaction(t *testing.T) {
	t.Parallel()
	st := openSQLite(t, filepath.Join(t.TempDir(), "outbox.db"))
	ctx := testContext(t, time.Minute)
	err := st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`CREATE TABLE results (key TEXT PRIMARY KEY, attempt INTEGER NOT NULL)`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	finish := func(job *consumer.Job) (*task.Task, error) {
		var doc *task.Task
		// The handler's context is not passed on: a handler that ignores
		// its cancellation is refused by the store itself.
		err := st.InTx(context.Background(), func(tx *sqlitestore.Tx) error {
			if _, err := tx.Exec(`INSERT INTO results (key, attempt) VALUES (?, ?)`, job.Task.Key, job.Attempt); err != nil {
				return err
			}
			var err error
			doc, err = tx.Succeed(job)
			return err
		})
		return doc, err
	}
	type outcome struct {
		doc *task.Task
		err error
	}
	shipped := make(chan outcome, 1)
	lost := make(chan outcome, 1)
	takenOver := make(chan struct{})
	mux := consumer.NewMux()
	mux.RegisterFunc("ship", func(ctx context.Context, job *consumer.Job) error {
		if err := job.SetResult(map[string]string{"by": "handler"}); err != nil {
			return err
		}
		doc, err := finish(job)
		shipped <- outcome{doc, err}
		return err
	})
	mux.RegisterFunc("late", func(ctx context.Context, job *consumer.Job) error {
		<-takenOver
		doc, err := finish(job)
		lost <- outcome{doc, err}
		return err
	})
	obs := &finishes{}
	c, err := consumer.New(consumer.Config{Store: st, Handler: mux, WorkerID: "w1", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })

	// Held lease: the row and the success commit together.
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "ship-1", Kind: "ship"}); err != nil {
		t.Fatal(err)
	}
	got := <-shipped
	if got.err != nil {
		t.Fatalf("finish with a held lease: %v", got.err)
	}
	eventually(t, 10*time.Second, "the ship attempt finished", func() bool { return len(obs.of("ship")) == 1 })
	if o := obs.of("ship"); o[0] != consumer.OutcomeSucceeded {
		t.Errorf("ship attempt's outcome %s; want %s", o[0], consumer.OutcomeSucceeded)
	}
	stored, err := st.Get(ctx, "ship-1")
	if err != nil {
		t.Fatal(err)
	}
	if stored.State != task.StateSucceeded || string(stored.Result()) != `{"by":"handler"}` {
		t.Errorf("ship-1 %s with result %s; want succeeded with the handler's result", stored.State, stored.Result())
	}
	if stored.Version != got.doc.Version {
		t.Errorf("ship-1 at version %d after the worker settled; the transaction wrote %d (the worker wrote again)", stored.Version, got.doc.Version)
	}
	if n := resultRows(t, st, "ship-1"); n != 1 {
		t.Errorf("ship-1's row: %d; want 1", n)
	}

	// Taken over: another worker's claim replaced the expired lease
	// while the handler was held up.
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "late-1", Kind: "late"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "late-1 claimed by w1", func() bool {
		d, err := st.Get(ctx, "late-1")
		return err == nil && len(d.Attempts) == 1 && d.Attempts[0].WorkerID == "w1"
	})
	_, err = task.Modify(ctx, st, "late-1", func(d *task.Task) error {
		d.Reap(d.Attempts[0].LeaseUntil.Add(time.Millisecond))
		d.Claim(task.Holder{WorkerID: "w2", Instance: "w2-instance"}, st.Now())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	close(takenOver)
	got = <-lost
	if !errors.Is(got.err, task.ErrLeaseLost) {
		t.Fatalf("finish after a takeover: %v; want ErrLeaseLost", got.err)
	}
	if n := resultRows(t, st, "late-1"); n != 0 {
		t.Errorf("late-1's row written %d times after its lease was lost; want 0", n)
	}
	d, err := st.Get(ctx, "late-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Attempts) != 2 || d.Attempts[1].WorkerID != "w2" || d.Attempts[1].State != task.AttemptRunning {
		t.Errorf("late-1's workers %+v; want w2's attempt running", d.Attempts)
	}
}

func resultRows(t *testing.T, st *sqlitestore.Store, key string) int {
	t.Helper()
	var n int
	err := st.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		return tx.QueryRow(`SELECT count(*) FROM results WHERE key = ?`, key).Scan(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
