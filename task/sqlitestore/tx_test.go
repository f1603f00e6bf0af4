package sqlitestore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// txStore opens a new store with the user's table orders(id, note).
func txStore(t *testing.T) *sqlitestore.Store {
	t.Helper()
	s := open(t, filepath.Join(t.TempDir(), "s.db"), nil)
	err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL, changes INTEGER NOT NULL DEFAULT 0)`)
		return err
	})
	if err != nil {
		t.Fatalf("create table: %v", err)
	}
	return s
}

// orderNote reads order id's note through a transaction; ok is false when
// the row is not there.
func orderNote(t *testing.T, s *sqlitestore.Store, id int) (note string, ok bool) {
	t.Helper()
	err := s.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		return tx.QueryRow(`SELECT note FROM orders WHERE id = ?`, id).Scan(&note)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	if err != nil {
		t.Fatalf("read order %d: %v", id, err)
	}
	return note, true
}

func count(t *testing.T, s *sqlitestore.Store, kind string, state task.State) int64 {
	t.Helper()
	st, err := s.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Counts {
		if c.Kind == kind && c.State == state {
			return c.N
		}
	}
	return 0
}

func TestInTxCommitsRowAndTask(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	stream, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	err = s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (?, ?)`, 1, "first"); err != nil {
			return err
		}
		// The transaction sees its own row.
		var n int
		if err := tx.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
			return fmt.Errorf("count in tx: %d, %v", n, err)
		}
		_, res, err := tx.Publish(task.PublishParams{Key: "order-1", Kind: "ship", Payload: json.RawMessage(`{"id":1}`)})
		if err != nil || res != task.Inserted {
			return fmt.Errorf("publish: %v, %v", res, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("InTx: %v", err)
	}
	if note, ok := orderNote(t, s, 1); !ok || note != "first" {
		t.Errorf("order 1: %q, %v; want first", note, ok)
	}
	got, err := s.Get(ctx, "order-1")
	if err != nil || got.Kind != "ship" || got.Version != 1 {
		t.Fatalf("task order-1: %+v, %v", got, err)
	}
	if n := count(t, s, "ship", task.StatePending); n != 1 {
		t.Errorf("pending ship tasks counted %d; want 1", n)
	}
	// The change stream carries the publish, as any other.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev, err := stream.Next(wctx)
	if err != nil || ev.Key != "order-1" || ev.Task == nil || ev.Task.Seq != got.Seq {
		t.Fatalf("first event %+v, %v; want order-1's publish", ev, err)
	}
	// Publishing the key again in a later transaction finds it.
	err = s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, res, err := tx.Publish(task.PublishParams{Key: "order-1", Kind: "ship"})
		if err == nil && res != task.Existing {
			err = fmt.Errorf("second publish: %s; want existing", res)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestInTxRollsBackBoth(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	boom := errors.New("boom")
	err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (2, 'two')`); err != nil {
			return err
		}
		if _, _, err := tx.Publish(task.PublishParams{Key: "order-2", Kind: "ship"}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx: %v; want fn's error", err)
	}
	if _, ok := orderNote(t, s, 2); ok {
		t.Error("order 2 kept after its transaction failed")
	}
	if _, err := s.Get(ctx, "order-2"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("task order-2 after rollback: %v; want ErrNotFound", err)
	}
	if n := count(t, s, "ship", task.StatePending); n != 0 {
		t.Errorf("pending ship tasks counted %d after rollback; want 0", n)
	}
	// The store goes on: the same key publishes now.
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "order-2", Kind: "ship"}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, "ship", task.StatePending); n != 1 {
		t.Errorf("pending ship tasks counted %d; want 1", n)
	}
}

func TestInTxBadPublishRollsBack(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	for field, p := range map[string]task.PublishParams{
		"kind":      {Key: "order-3", Kind: ""},
		"key":       {Key: "leasepool:mine", Kind: "ship"},
		"payload":   {Key: "order-3", Kind: "ship", Payload: json.RawMessage(`{"id":`)},
		"lock_keys": {Key: "order-3", Kind: "ship", Options: task.Options{LockKeys: []string{""}}},
	} {
		var pubErr error
		err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (3, 'three')`); err != nil {
				return err
			}
			_, _, pubErr = tx.Publish(p)
			return nil // the failed publish dooms the transaction all the same
		})
		if !errors.Is(err, task.ErrInvalid) || !errors.Is(pubErr, task.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: InTx %v, Publish %v; want ErrInvalid naming %s", field, err, pubErr, field)
		}
		if _, ok := orderNote(t, s, 3); ok {
			t.Errorf("%s: the row committed with a refused publish", field)
		}
	}
}

func TestInTxGuardsLeasepoolTables(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "keep", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	refused := map[string]string{
		`DELETE FROM tasks`:            "tasks",
		`SELECT * FROM changes`:        "changes",
		`UPDATE task_counts SET n = 0`: "task_counts",
		`INSERT INTO locks (ns, key, task_key, worker_id, attempt, until) VALUES ('', 'k', 't', 'w', 1, 0)`: "locks",
		`DROP TABLE documents`:                                       "documents",
		`ALTER TABLE workers ADD COLUMN x`:                           "workers",
		`CREATE TABLE IF NOT EXISTS tasks (x)`:                       "tasks",
		`CREATE TABLE leasepool_mine (x)`:                            "leasepool_mine",
		`CREATE INDEX mine ON lock_lines (ns)`:                       "lock_lines",
		`CREATE TEMP VIEW changes AS SELECT 1`:                       "changes",
		`CREATE TRIGGER t AFTER INSERT ON tasks BEGIN SELECT 1; END`: "tasks",
		`CREATE VIEW v AS SELECT * FROM orders; SELECT * FROM tasks`: "tasks",
		`COMMIT`:                              "transaction control",
		`SAVEPOINT x`:                         "transaction control",
		`PRAGMA user_version = 99`:            "user_version",
		`PRAGMA journal_mode = DELETE`:        "journal_mode",
		`ATTACH DATABASE ':memory:' AS other`: "ATTACH",
		`UPDATE sqlite_sequence SET seq = 0`:  "sqlite_sequence",
	}
	for q, name := range refused {
		err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
			_, err := tx.Exec(q)
			return err
		})
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line wrapping ErrInvalid naming %s", q, err, name)
		}
	}
	// A trigger of the user's that writes leasepool's tables is created
	// (its body is not compiled yet) but refused with the first statement
	// that would run it, and nothing of that statement stays.
	err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`CREATE TRIGGER sneaky AFTER INSERT ON orders BEGIN DELETE FROM tasks; END`)
		return err
	})
	if err != nil {
		t.Fatalf("create trigger: %v", err)
	}
	err = s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (9, 'nine')`)
		return err
	})
	if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "tasks") {
		t.Errorf("insert firing a trigger on tasks: %v; want ErrInvalid naming tasks", err)
	}
	if _, err := s.Get(ctx, "keep"); err != nil {
		t.Errorf("task keep: %v", err)
	}
	// The user's own SQL runs, with columns of any name, AUTOINCREMENT,
	// their own indexes and triggers, and the schema's info pragmas.
	err = s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		for _, q := range []string{
			`DROP TRIGGER sneaky`,
			`CREATE TABLE audit (n INTEGER PRIMARY KEY AUTOINCREMENT, tasks TEXT, locks TEXT)`,
			`CREATE INDEX audit_tasks ON audit (tasks)`,
			`CREATE TRIGGER audit_orders AFTER INSERT ON orders BEGIN INSERT INTO audit (tasks) VALUES (new.note); END`,
			`INSERT INTO orders (id, note) VALUES (10, 'ten')`,
			`UPDATE orders SET changes = changes + 1 WHERE id = 10`,
			`PRAGMA table_info(orders)`,
			`ALTER TABLE orders ADD COLUMN shipped INTEGER`,
		} {
			if _, err := tx.Exec(q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		var got string
		if err := tx.QueryRow(`SELECT tasks FROM audit`).Scan(&got); err != nil || got != "ten" {
			return fmt.Errorf("audit row %q, %v", got, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the user's own SQL: %v", err)
	}
	// leasepool's own writes still run after the guard refused the user's.
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "after", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s, "k", task.StatePending); n != 2 {
		t.Errorf("pending k tasks counted %d; want 2", n)
	}
}

// TestReservedNamesCoverSchema keeps ReservedNames in step with the
// schema: every table and index of a new store is reserved.
func TestReservedNamesCoverSchema(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	open(t, path, nil)
	rows, err := rawDB(t, path).Query(`SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		n++
		if !sqlitestore.Reserved(name) {
			t.Errorf("%s is in the schema but not reserved", name)
		}
	}
	if n < 8 {
		t.Errorf("read %d names from the schema; want at least its 8 tables", n)
	}
}

func TestInTxStoreWriteInsideFails(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	var inner error
	err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, _, inner = task.Publish(ctx, s, task.PublishParams{Key: "inner", Kind: "k"})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, sqlitestore.ErrWriteInTx) {
		t.Errorf("Publish on the store inside InTx: %v; want ErrWriteInTx", inner)
	}
	if err := s.InTx(ctx, nil); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("InTx(nil): %v; want ErrInvalid", err)
	}
	// Other goroutines' writes wait for the function rather than fail.
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.InTx(ctx, func(tx *sqlitestore.Tx) error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	published := make(chan error, 1)
	go func() {
		_, _, err := task.Publish(ctx, s, task.PublishParams{Key: "outer", Kind: "k"})
		published <- err
	}()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-published; err != nil {
		t.Fatalf("publish from another goroutine: %v", err)
	}
}

func TestInTxPanicRaisedInCaller(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	func() {
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(fmt.Sprint(r), "kaboom") {
				t.Errorf("recovered %v; want the function's panic", r)
			}
		}()
		_ = s.InTx(ctx, func(tx *sqlitestore.Tx) error {
			if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (4, 'four')`); err != nil {
				return err
			}
			rows, err := tx.Query(`SELECT id FROM orders`) // left open
			if err != nil {
				return err
			}
			_ = rows
			panic("kaboom")
		})
	}()
	if _, ok := orderNote(t, s, 4); ok {
		t.Error("order 4 kept after its function panicked")
	}
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "after-panic", Kind: "k"}); err != nil {
		t.Fatalf("publish after the panic: %v", err)
	}
}

// attempt is a handler's attempt as Tx.Succeed sees it.
type attempt struct {
	h   task.Holder
	out task.Output

	mu  sync.Mutex
	doc *task.Task
}

func (a *attempt) Holder() task.Holder { return a.h }
func (a *attempt) Output() task.Output { return a.out }
func (a *attempt) Succeeded(doc *task.Task) {
	a.mu.Lock()
	a.doc = doc
	a.mu.Unlock()
}

// claim publishes key and claims it as worker w.
func claim(t *testing.T, s *sqlitestore.Store, key, w string) *attempt {
	t.Helper()
	ctx := t.Context()
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: key, Kind: "ship"}); err != nil {
		t.Fatal(err)
	}
	var h task.Holder
	if _, err := task.Modify(ctx, s, key, func(d *task.Task) error {
		h = d.Claim(task.Holder{WorkerID: w, Instance: "i-" + w}, s.Now())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &attempt{h: h, out: task.Output{Result: json.RawMessage(`{"shipped":true}`)}}
}

func TestInTxSucceed(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	a := claim(t, s, "order-5", "w1")
	err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (5, 'shipped')`); err != nil {
			return err
		}
		_, err := tx.Succeed(a)
		return err
	})
	if err != nil {
		t.Fatalf("InTx: %v", err)
	}
	got, err := s.Get(ctx, "order-5")
	if err != nil || got.State != task.StateSucceeded || string(got.Result()) != `{"shipped":true}` {
		t.Fatalf("task after Succeed: %+v, %v; want succeeded with the result", got, err)
	}
	a.mu.Lock()
	told := a.doc
	a.mu.Unlock()
	if told == nil || told.Version != got.Version || told.State != task.StateSucceeded {
		t.Errorf("attempt told %+v; want the stored version %d", told, got.Version)
	}
	if _, ok := orderNote(t, s, 5); !ok {
		t.Error("order 5 missing after its commit")
	}
	if n := count(t, s, "ship", task.StateSucceeded); n != 1 {
		t.Errorf("succeeded ship tasks counted %d; want 1", n)
	}
}

func TestInTxSucceedLeaseLostRollsBack(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	a := claim(t, s, "order-6", "w1")
	if _, err := task.Cancel(ctx, s, "order-6"); err != nil {
		t.Fatal(err)
	}
	var succErr error
	err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (6, 'shipped')`); err != nil {
			return err
		}
		_, succErr = tx.Succeed(a)
		return nil // refused all the same
	})
	if !errors.Is(err, task.ErrLeaseLost) || !errors.Is(succErr, task.ErrLeaseLost) {
		t.Fatalf("InTx %v, Succeed %v; want ErrLeaseLost", err, succErr)
	}
	if _, ok := orderNote(t, s, 6); ok {
		t.Error("the business write committed with a lost lease")
	}
	if a.doc != nil {
		t.Error("the attempt was told it succeeded")
	}
}

// TestInTxConcurrent runs transactions beside plain writes: every one
// commits once, in the writer's batches.
func TestInTxConcurrent(t *testing.T) {
	t.Parallel()
	s := txStore(t)
	ctx := t.Context()
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			errs <- s.InTx(ctx, func(tx *sqlitestore.Tx) error {
				if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (?, 'x')`, 100+i); err != nil {
					return err
				}
				_, _, err := tx.Publish(task.PublishParams{Key: fmt.Sprintf("tx-%d", i), Kind: "ship"})
				return err
			})
		})
		wg.Go(func() {
			_, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprintf("plain-%d", i), Kind: "ship"})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows int
	if err := s.InTx(ctx, func(tx *sqlitestore.Tx) error {
		return tx.QueryRow(`SELECT count(*) FROM orders WHERE id >= 100`).Scan(&rows)
	}); err != nil || rows != n {
		t.Fatalf("rows %d, %v; want %d", rows, err, n)
	}
	if c := count(t, s, "ship", task.StatePending); c != 2*n {
		t.Errorf("pending ship tasks counted %d; want %d", c, 2*n)
	}
}
