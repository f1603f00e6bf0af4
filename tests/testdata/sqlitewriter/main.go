// Command sqlitewriter changes the user's table readings in a leasepool
// embedded store's file through its own database/sql connections (the
// driver the store uses), as another program of the user's would, for
// tests/trigger_sqlite_test.go: n changes in all, half inserts of rows
// 0..n/2-1 (match = 1 but for every fourth row), half updates setting
// v = 1 on each of them, from 4 connections at once; and besides them,
// every tenth insert also a transaction inserting a matching row that it
// rolls back (which must make no task). It prints "done N" at the end.
package main

import (
	"database/sql"
	"flag"
	"fmt"
	"log"
	"sync"

	_ "modernc.org/sqlite"
)

func main() {
	path := flag.String("db", "", "the store's file")
	n := flag.Int("n", 5000, "changes to make (inserts and updates, half each)")
	flag.Parse()
	db, err := sql.Open("sqlite", "file:"+*path+"?_pragma=busy_timeout(60000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	const conns = 4
	db.SetMaxOpenConns(conns)
	rows := *n / 2
	var wg sync.WaitGroup
	for c := range conns {
		wg.Go(func() {
			for i := c; i < rows; i += conns {
				match := 1
				if i%4 == 0 {
					match = 0
				}
				if _, err := db.Exec(`INSERT INTO readings (id, match, v) VALUES (?, ?, 0)`, i, match); err != nil {
					log.Fatalf("insert %d: %v", i, err)
				}
				if i%10 == 0 {
					tx, err := db.Begin()
					if err != nil {
						log.Fatal(err)
					}
					if _, err := tx.Exec(`INSERT INTO readings (id, match, v) VALUES (?, 1, 0)`, 1_000_000+i); err != nil {
						log.Fatalf("insert to roll back %d: %v", i, err)
					}
					if err := tx.Rollback(); err != nil {
						log.Fatal(err)
					}
				}
			}
			for i := c; i < rows; i += conns {
				if _, err := db.Exec(`UPDATE readings SET v = 1 WHERE id = ?`, i); err != nil {
					log.Fatalf("update %d: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("done %d\n", 2*rows)
}
