// Command outboxwriter is a library user's producer on the embedded store:
// each of its transactions writes a row of its own table, orders, and
// publishes the task that ships it, in one commit (sqlitestore.InTx). It
// writes the orders 0..n-1 that are not there yet, from several
// goroutines, and exits 0 when all are. A task found already there for a
// row it writes (a task whose row was lost) fails it with exit status 3.
//
//	outboxwriter --store sqlite:PATH --n 1000
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func main() {
	storeURL := flag.String("store", "", "store URL (sqlite:PATH)")
	n := flag.Int("n", 1000, "orders to write")
	writers := flag.Int("writers", 4, "concurrent transactions")
	flag.Parse()
	ctx := context.Background()
	s, err := store.Open(ctx, *storeURL, store.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	st, ok := store.SQLite(s)
	if !ok {
		log.Fatalf("--store %s: not an embedded store", *storeURL)
	}
	done := map[int]bool{}
	err = st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT NOT NULL)`); err != nil {
			return err
		}
		rows, err := tx.Query(`SELECT id FROM orders`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id int
			if err := rows.Scan(&id); err != nil {
				return err
			}
			done[id] = true
		}
		return rows.Err()
	})
	if err != nil {
		log.Fatal(err)
	}

	todo := make(chan int)
	var wg sync.WaitGroup
	for range *writers {
		wg.Go(func() {
			for id := range todo {
				if err := write(ctx, st, id); err != nil {
					var orphan *orphanError
					if errors.As(err, &orphan) {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(3)
					}
					log.Fatal(err)
				}
			}
		})
	}
	for id := range *n {
		if !done[id] {
			todo <- id
		}
	}
	close(todo)
	wg.Wait()
	fmt.Println("done")
}

// write writes order id and publishes its task, in one transaction.
func write(ctx context.Context, st *sqlitestore.Store, id int) error {
	key := fmt.Sprintf("order-%04d", id)
	return st.InTx(ctx, func(tx *sqlitestore.Tx) error {
		if _, err := tx.Exec(`INSERT INTO orders (id, note) VALUES (?, ?)`, id, "ship "+key); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]int{"id": id})
		_, res, err := tx.Publish(task.PublishParams{Key: key, Kind: "ship", Payload: payload})
		if err != nil {
			return err
		}
		if res != task.Inserted {
			return &orphanError{key}
		}
		return nil
	})
}

type orphanError struct{ key string }

func (e *orphanError) Error() string {
	return fmt.Sprintf("ORPHAN: task %s was there before its row", e.key)
}
