package sqlitestore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func Example() {
	dir, err := os.MkdirTemp("", "leasepool")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(dir, "leasepool.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	stream, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Close()

	t, res, err := task.Publish(ctx, s, task.PublishParams{Key: "report-2024", Kind: "report"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res, t.State, t.Version)
	_, res, _ = task.Publish(ctx, s, task.PublishParams{Key: "report-2024", Kind: "report"})
	fmt.Println(res)

	ev, err := stream.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("changed:", ev.Key)
	// Output:
	// inserted pending 1
	// existing
	// changed: report-2024
}
