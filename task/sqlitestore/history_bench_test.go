package sqlitestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkUpdateWithHistory measures what attempt history costs every
// write of a task (a renewal rewrites the whole document): no history, a
// typical full one (MaxHistory attempts with two short log lines each) and
// the largest one (every attempt recorded a result and log lines at their
// limits: MaxHistoryOutput bounds what history keeps of them). It reports
// the stored document's size.
func BenchmarkUpdateWithHistory(b *testing.B) {
	line := func(n int) string { return strings.Repeat("x", n) }
	cases := []struct {
		name string
		out  func(i int) task.Output
	}{
		{"none", nil},
		{"typical", func(i int) task.Output {
			return task.Output{Log: []task.LogLine{{Msg: "device offline, snoozing"}, {Msg: fmt.Sprint("try ", i)}}}
		}},
		{"largest", func(i int) task.Output {
			o := task.Output{Result: json.RawMessage(`"` + line(task.MaxResultSize-2) + `"`)}
			for range task.MaxLogLines {
				o.Log = append(o.Log, task.LogLine{Msg: line(task.MaxLogLineLen)})
			}
			return o
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			s := open(b, filepath.Join(b.TempDir(), "leasepool.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
			ctx := context.Background()
			tk, _, err := task.Publish(ctx, s, task.PublishParams{Key: "a", Kind: "k", Payload: []byte(`{"n":1}`)})
			if err != nil {
				b.Fatal(err)
			}
			now := s.Now()
			// MaxHistory snoozed attempts, through the mutations, so the
			// history's bounds apply.
			for i := range task.MaxHistory {
				if c.out == nil {
					break
				}
				h := tk.Claim(task.Holder{WorkerID: "worker-1", Instance: "instance-1"}, now)
				out := c.out(i)
				for j := range out.Log {
					out.Log[j].At = now
				}
				tk.Record(h, out)
				if err := tk.Snooze(h, now, now); err != nil {
					b.Fatal(err)
				}
			}
			doc, _ := json.Marshal(tk)
			start := time.Now()
			for b.Loop() {
				tk.Priority++
				if err := s.Update(ctx, tk); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
			b.ReportMetric(float64(len(doc)), "doc-bytes")
		})
	}
}
