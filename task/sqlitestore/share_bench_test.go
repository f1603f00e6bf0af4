package sqlitestore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkSharedUpdates compares updates made by 32 goroutines on the
// writer's Store with the same made through another Store on the file,
// which forwards them to the writer.
func BenchmarkSharedUpdates(b *testing.B) {
	for _, via := range []string{"writer", "client", "direct"} {
		b.Run(via, func(b *testing.B) {
			ctx := context.Background()
			path := filepath.Join(b.TempDir(), "s.db")
			w, err := sqlitestore.Open(ctx, path, &sqlitestore.Config{ServeWrites: true})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			st := w
			if via != "writer" {
				st, err = sqlitestore.Open(ctx, path, &sqlitestore.Config{DirectWrites: via == "direct"})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
			}
			const n = 32
			tasks := make([]*task.Task, n)
			for i := range tasks {
				tk, _, err := task.Publish(ctx, st, task.PublishParams{Key: fmt.Sprintf("k%d", i), Kind: "noop"})
				if err != nil {
					b.Fatal(err)
				}
				tasks[i] = tk
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					t := tasks[i]
					for j := i; j < b.N; j += n {
						t.Priority = j % 7
						if err := st.Update(ctx, t); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "updates/s")
		})
	}
}
