package mqttdev

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// BenchmarkSelectIndex compares Select off the index with the scan it
// replaced (every entry read, decoded and matched), interleaved in one
// run, on an inventory of LEASEPOOL_BENCH_DEVICES entries (100,000 by
// default) on memstore and on SQLite on disk, for selectors matching 10 %
// of the devices (one term), 1 % (two terms intersected) and 1 % (one
// term). It prints milliseconds per selection, the median of the rounds.
//
//	go test -run '^$' -bench SelectIndex -benchtime 1x ./mqttdev/
func BenchmarkSelectIndex(b *testing.B) {
	devices := 100_000
	if v := os.Getenv("LEASEPOOL_BENCH_DEVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			b.Fatalf("LEASEPOOL_BENCH_DEVICES=%q: want a count of at least 100", v)
		}
		devices = n
	}
	const rounds = 7
	for _, backend := range []string{"memstore", "sqlite"} {
		b.Run(backend, func(b *testing.B) {
			var st task.Store
			if backend == "memstore" {
				st = memstore.New(memstore.Config{}).Open()
			} else {
				s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "s.db"), nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				st = s
			}
			began := time.Now()
			fillInventory(b, st, devices)
			b.Logf("%s: %d entries written in %s", backend, devices, time.Since(began).Round(time.Millisecond))
			for range b.N {
				for _, s := range []struct{ sel, share string }{
					{"region=r3", "10 %"},
					{"region=r3,attr:model=m7", "1 %, two terms"},
					{"rack=k42", "1 %, one term"},
				} {
					sel, err := ParseSelector(s.sel)
					if err != nil {
						b.Fatal(err)
					}
					var scan, index []time.Duration
					var picked int
					for range rounds {
						t0 := time.Now()
						want := scanSelect(b, st, sel)
						t1 := time.Now()
						got, err := Select(b.Context(), st, sel)
						t2 := time.Now()
						if err != nil || !slices.Equal(got.Devices, want.Devices) || !slices.Equal(got.New, want.New) {
							b.Fatalf("%s: Select %s picked %d+%d, the scan %d+%d (%v)", backend, s.sel, len(got.Devices), len(got.New), len(want.Devices), len(want.New), err)
						}
						scan, index = append(scan, t1.Sub(t0)), append(index, t2.Sub(t1))
						picked = len(got.Devices) + len(got.New)
					}
					ms := func(d []time.Duration) float64 {
						slices.Sort(d)
						return float64(d[len(d)/2].Microseconds()) / 1000
					}
					fmt.Printf("%-8s %7d entries  %-26s %-15s %6d picked  scan %8.1f ms  index %7.1f ms\n",
						backend, devices, s.sel, s.share, picked, ms(scan), ms(index))
				}
			}
		})
	}
}

// fillInventory writes n entries, one write each, from several writers:
// operator labels region (r0..r9) and rack (k0..k99), announced model
// (m0..m9, apart from region) and firmware, and nine in ten vouched for.
func fillInventory(b *testing.B, st task.Store, n int) {
	const writers = 32
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += writers {
				id := fmt.Sprintf("dev-%06d", i)
				at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
				_, err := updateInventory(b.Context(), st, id, func(inv *Inventory) (bool, error) {
					inv.Labels = Labels{"region": fmt.Sprintf("r%d", i%10), "rack": fmt.Sprintf("k%d", (i/10)%100), "site": "s1"}
					inv.Attributes = Labels{"model": fmt.Sprintf("m%d", (i/100)%10), "fw": "2.1." + strconv.Itoa(i%3)}
					inv.AnnouncedAt = at
					if i%10 != 9 {
						inv.Vouched = &Vouching{By: "ops", At: at}
					}
					return true, nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
