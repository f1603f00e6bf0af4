// Command whitelist is the face-recognition whitelist case on the
// embedded store: each change of a person's access to a door device is a
// row of the program's own table, wl_changes, written in the same commit
// as the device command that carries it out (a device task); a worker
// sends the commands over MQTT, one at a time per device and at most a
// given rate per device; and when a device reports success, the row is
// marked applied in the same commit as the task's finish. A crash
// anywhere leaves no change without its command, no command without its
// change, and no success not written back.
//
// Everything runs in this one process for the demonstration: the store
// file, a worker hosting the embedded MQTT broker, and simulated devices.
//
//	go run ./examples/whitelist [--store FILE] [--devices 3] [--people 4] [--rate 2/1s] [--fail-rate 0.1]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/worker"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.store, "store", "", "store file (default: a new one in a temporary directory)")
	flag.IntVar(&cfg.devices, "devices", 3, "simulated door devices")
	flag.IntVar(&cfg.people, "people", 4, "people added to every device's whitelist")
	rate := flag.String("rate", "2/1s", "commands per device and period")
	flag.Float64Var(&cfg.failRate, "fail-rate", 0.1, "probability that a device reports a command failed (the task is retried)")
	flag.Parse()
	var err error
	if cfg.rateN, cfg.ratePer, err = control.ParseRate(*rate); err != nil {
		log.Fatalf("--rate: %v", err)
	}
	if cfg.store == "" {
		dir, err := os.MkdirTemp("", "whitelist-")
		if err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
		cfg.store = filepath.Join(dir, "whitelist.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	changes, err := run(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if err != nil {
		log.Fatal(err)
	}
	printChanges(os.Stdout, changes)
}

type config struct {
	store             string
	devices, people   int
	rateN             int
	ratePer           time.Duration
	failRate          float64
	brokerAddr        string // default: a free loopback port
	maxRetries        int    // per command; default 10
	retryFirst        time.Duration
	applyBefore, poll time.Duration
}

// change is one row of wl_changes.
type change struct {
	ID        int64
	Person    string
	Device    string
	Op        string
	Status    string // pending, then applied
	Attempt   int    // the device task's attempt that applied it
	AppliedAt time.Time
}

const schema = `CREATE TABLE IF NOT EXISTS wl_changes (
	id INTEGER PRIMARY KEY AUTOINCREMENT,
	person TEXT NOT NULL,
	device TEXT NOT NULL,
	op TEXT NOT NULL CHECK (op IN ('add', 'remove')),
	status TEXT NOT NULL DEFAULT 'pending',
	attempt INTEGER,
	applied_at INTEGER
)`

// run writes a change per person and device, runs the worker and the
// devices until every change is applied, and returns the changes.
func run(ctx context.Context, cfg config, logger *slog.Logger) ([]change, error) {
	if cfg.maxRetries == 0 {
		cfg.maxRetries = 10
	}
	if cfg.retryFirst == 0 {
		cfg.retryFirst = 200 * time.Millisecond
	}
	if cfg.applyBefore == 0 {
		cfg.applyBefore = 2 * time.Minute
	}
	if cfg.poll == 0 {
		cfg.poll = 50 * time.Millisecond
	}
	if cfg.brokerAddr == "" {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		cfg.brokerAddr = addr
	}
	s, err := store.Open(ctx, "sqlite:"+cfg.store, store.Options{Logger: logger})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	st, ok := store.SQLite(s)
	if !ok {
		return nil, errors.New("not an embedded store")
	}
	// The table is the program's own: its schema is created (and later
	// changed) by the program, in a transaction of the store's file.
	if err := st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(schema)
		return err
	}); err != nil {
		return nil, fmt.Errorf("create wl_changes: %w", err)
	}
	// Every device takes at most rateN commands per ratePer, each device
	// counted alone; one command at a time per device is the device
	// task's own lock key (mqttdev.LockKey).
	if err := control.SetLimit(ctx, s, control.Limit{Target: control.Lock("device:*"), N: cfg.rateN, Per: cfg.ratePer}); err != nil {
		return nil, err
	}

	mux := consumer.NewMux()
	mux.Use(writeBack(st))
	w, err := worker.New(worker.Config{
		Store: s, Mux: mux, ID: "whitelist-worker", Kinds: []string{mqttdev.Kind},
		RetryPolicy: consumer.ExponentialBackoff(cfg.retryFirst, 2*time.Second),
		Devices: worker.Devices{
			EmbeddedBroker: cfg.brokerAddr, EmbeddedBrokerAnonymous: true, // a demonstration: no device credentials
			EmbeddedBrokerLease: time.Second, Prefix: "wl",
		},
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	defer w.Stop(context.Background())
	sim, err := device.NewSimulator(device.Config{
		BrokerURL: "tcp://" + cfg.brokerAddr, Prefix: "wl", IDPrefix: "door-", Count: cfg.devices,
		Latency: 20 * time.Millisecond, FailRate: cfg.failRate,
	})
	if err != nil {
		return nil, err
	}
	if err := sim.Start(ctx); err != nil {
		return nil, err
	}
	defer sim.Stop(context.Background())

	for p := range cfg.people {
		for d := range cfg.devices {
			if _, err := addChange(ctx, st, fmt.Sprintf("person-%d", p), fmt.Sprintf("door-%d", d), "add", cfg.maxRetries); err != nil {
				return nil, err
			}
		}
	}
	want := cfg.people * cfg.devices
	deadline := time.Now().Add(cfg.applyBefore)
	for {
		changes, err := readChanges(ctx, st)
		if err != nil {
			return nil, err
		}
		applied := 0
		for _, c := range changes {
			if c.Status == "applied" {
				applied++
			}
		}
		if applied == want {
			return changes, nil
		}
		if time.Now().After(deadline) {
			return changes, fmt.Errorf("%d of %d changes applied after %s", applied, want, cfg.applyBefore)
		}
		select {
		case <-ctx.Done():
			return changes, ctx.Err()
		case <-time.After(cfg.poll):
		}
	}
}

// addChange records a whitelist change and publishes the device command
// that carries it out, in one commit: both or neither.
func addChange(ctx context.Context, st *sqlitestore.Store, person, dev, op string, maxRetries int) (int64, error) {
	var id int64
	err := st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		res, err := tx.Exec(`INSERT INTO wl_changes (person, device, op) VALUES (?, ?, ?)`, person, dev, op)
		if err != nil {
			return err
		}
		if id, err = res.LastInsertId(); err != nil {
			return err
		}
		args, _ := json.Marshal(map[string]string{"person": person})
		p, err := mqttdev.PublishParams(changeKey(id), mqttdev.Command{
			Device: dev, Command: "whitelist." + op, Args: args,
		}, task.Options{MaxUnexpectedRetries: maxRetries})
		if err != nil {
			return err
		}
		_, _, err = tx.Publish(p)
		return err
	})
	return id, err
}

// The device task of change id is keyed by it: a replayed publish of one
// change finds its task, and the write-back finds its row.
func changeKey(id int64) string { return "wl-" + strconv.FormatInt(id, 10) }

func changeID(key string) (int64, bool) {
	s, ok := strings.CutPrefix(key, "wl-")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(s, 10, 64)
	return id, err == nil
}

// writeBack wraps the device kind's handler: when the device reported
// success, the change's row is marked applied in the same commit as the
// task's success (Tx.Succeed). A lost lease refuses both (another holder
// runs the command and writes it back); a failed or snoozed attempt is
// left to the worker, and the row stays pending until a later attempt
// succeeds.
func writeBack(st *sqlitestore.Store) consumer.Middleware {
	return func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			id, ok := changeID(job.Task.Key)
			if job.Task.Kind != mqttdev.Kind || !ok {
				return next.Handle(ctx, job)
			}
			if err := next.Handle(ctx, job); err != nil {
				return err
			}
			return st.InTx(ctx, func(tx *sqlitestore.Tx) error {
				res, err := tx.Exec(`UPDATE wl_changes SET status = 'applied', attempt = ?, applied_at = ? WHERE id = ?`,
					job.Attempt, time.Now().UnixMilli(), id)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n != 1 {
					return fmt.Errorf("change %d: %d rows updated, %v", id, n, err)
				}
				_, err = tx.Succeed(job)
				return err
			})
		})
	}
}

func readChanges(ctx context.Context, st *sqlitestore.Store) ([]change, error) {
	var out []change
	err := st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		out = out[:0]
		rows, err := tx.Query(`SELECT id, person, device, op, status, COALESCE(attempt, 0), COALESCE(applied_at, 0) FROM wl_changes ORDER BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c change
			var at int64
			if err := rows.Scan(&c.ID, &c.Person, &c.Device, &c.Op, &c.Status, &c.Attempt, &at); err != nil {
				return err
			}
			if at > 0 {
				c.AppliedAt = time.UnixMilli(at)
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	return out, err
}

func printChanges(w io.Writer, changes []change) {
	fmt.Fprintf(w, "%-4s %-10s %-8s %-4s %-8s %s\n", "id", "person", "device", "op", "status", "attempt")
	for _, c := range changes {
		fmt.Fprintf(w, "%-4d %-10s %-8s %-4s %-8s %d\n", c.ID, c.Person, c.Device, c.Op, c.Status, c.Attempt)
	}
}

// freeAddr is a loopback address with a port free a moment ago, for the
// embedded broker.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
