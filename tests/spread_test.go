package tests

// Figures for claim spreading across worker processes on one embedded
// store, printed on demand (not a timed test): claim conflicts per task
// with 1, 2, 4 and 8 idle worker processes while tasks are published at
// 500/s. The drain by 1 and by 4 processes is BenchmarkDrainScaling.
//
//	go test ./tests -run '^$' -bench SpreadFigures -benchtime 1x

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// fastBin builds the CLI without the race detector: figures of a
// race-instrumented binary would measure the detector.
func fastBin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "leasepool")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/leasepool").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metricSum sums the samples of one metric on a worker's /metrics, or
// reads one series when name carries its labels (`m{l="v"}`).
func metricSum(t testing.TB, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

type figureWorkers struct {
	cmds  []*exec.Cmd
	addrs []string
}

// startFigureWorkers starts n worker processes of the noop kind; global,
// when not nil, gives worker i's flags before the command (a CPU profile).
func startFigureWorkers(t testing.TB, bin, url string, n, concurrency int, global func(i int) []string) *figureWorkers {
	t.Helper()
	fw := &figureWorkers{}
	for i := range n {
		addr := freePort(t)
		args := []string{"--store", url, "--log-level", "error"}
		if global != nil {
			args = append(args, global(i)...)
		}
		args = append(args, "worker", "--id", fmt.Sprintf("f%d", i),
			"--kinds", "noop", "--concurrency", strconv.Itoa(concurrency), "--metrics-addr", addr)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		fw.cmds = append(fw.cmds, cmd)
		fw.addrs = append(fw.addrs, addr)
	}
	t.Cleanup(fw.stop)
	return fw
}

func (fw *figureWorkers) stop() {
	for _, c := range fw.cmds {
		if c.ProcessState == nil {
			c.Process.Signal(os.Interrupt)
		}
	}
	for _, c := range fw.cmds {
		if c.ProcessState == nil {
			c.Wait()
		}
	}
}

// waitLive waits until n workers are registered and have read the
// registry with each other in it: each has renewed its registration
// twice since, and a read follows each renewal.
func waitLive(t testing.TB, st task.Store, n int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("%d live workers", n), func() bool {
		ws, err := st.Workers(context.Background())
		if err != nil {
			return false
		}
		live := 0
		for _, w := range ws {
			if w.Live(st.Now()) {
				live++
			}
		}
		return live == n
	})
	allLive := st.Now()
	first := map[string]time.Time{} // each worker's first heartbeat since
	eventually(t, 30*time.Second, "each worker to read the registry with the others in it", func() bool {
		ws, err := st.Workers(context.Background())
		if err != nil {
			return false
		}
		read := 0
		for _, w := range ws {
			key := w.ID + "/" + w.Instance
			switch h, ok := first[key]; {
			case !ok && w.Heartbeat.After(allLive):
				first[key] = w.Heartbeat
			case ok && w.Heartbeat.After(h):
				read++
			}
		}
		return read >= n
	})
}

func waitSucceeded(t testing.TB, st task.Store, n int) {
	t.Helper()
	eventually(t, 5*time.Minute, fmt.Sprintf("%d tasks to succeed", n), func() bool {
		s, err := st.Stats(context.Background())
		return err == nil && s.ByState()[task.StateSucceeded] >= int64(n)
	})
}

func openFigureStore(t testing.TB) (task.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "figures.db")
	st, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, "sqlite:" + path
}

// BenchmarkSpreadFigures prints the claim-spreading figures: worker
// processes on one embedded store (go test ./tests -run '^$' -bench
// SpreadFigures -benchtime 1x).
func BenchmarkSpreadFigures(t *testing.B) {
	bin := fastBin(t)
	printConflictFigures(t, bin, 2000, 2*time.Millisecond, // 500/s
		func(t *testing.B) (task.Store, string) { return openFigureStore(t) })
}

// printConflictFigures prints the claim conflicts per task with 1, 2, 4
// and 8 idle worker processes of bin while tasks noop tasks are published,
// one each interval, on a store of each run's own that open returns with
// its --store URL, and each task's wait from its publish to its start.
// With LEASEPOOL_BENCH_BASELINE_BIN naming another build of the CLI (an
// earlier commit's, say), each count runs on both builds, in turns that
// alternate which goes first, so that the two meet the same load.
func printConflictFigures(b *testing.B, bin string, tasks int, interval time.Duration, open func(*testing.B) (task.Store, string)) {
	builds := []string{"this"}
	bins := map[string]string{"this": bin}
	if base := os.Getenv("LEASEPOOL_BENCH_BASELINE_BIN"); base != "" {
		builds = append(builds, "baseline")
		bins["baseline"] = base
	}
	fmt.Println("| build | worker processes | tasks | claims | claim conflicts | conflicts per task | publish to start p50 | p99 |")
	fmt.Println("|--|--:|--:|--:|--:|--:|--:|--:|")
	for i, n := range []int{1, 2, 4, 8} {
		order := slices.Clone(builds)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, build := range order {
			b.Run(fmt.Sprintf("conflicts-%d-%s", n, build), func(b *testing.B) {
				st, url := open(b)
				fw := startFigureWorkers(b, bins[build], url, n, 4, nil)
				waitLive(b, st, n)
				publishPaced(b, st, tasks, interval)
				waitSucceeded(b, st, tasks)
				var claims, conflicts float64
				for _, a := range fw.addrs {
					claims += metricSum(b, a, "leasepool_tasks_claimed_total")
					conflicts += metricSum(b, a, "leasepool_claim_conflicts_total")
				}
				p50, p99 := startWaits(b, st)
				fmt.Printf("| %s | %d | %d | %.0f | %.0f | %.3f | %s | %s |\n", build, n, tasks, claims, conflicts, conflicts/float64(tasks),
					p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
				fw.stop()
			})
		}
	}
}

// startWaits returns the median and 99th percentile of the time from each
// task's publish to its first attempt's start, both in store time.
func startWaits(b *testing.B, st task.Store) (p50, p99 time.Duration) {
	ts, err := st.List(context.Background(), task.ListQuery{KeyPrefix: "c"})
	if err != nil {
		b.Fatal(err)
	}
	var waits []time.Duration
	for _, t := range ts {
		if len(t.Attempts) > 0 {
			waits = append(waits, t.Attempts[0].StartedAt.Sub(t.CreatedAt))
		}
	}
	if len(waits) == 0 {
		b.Fatal("no task started")
	}
	slices.Sort(waits)
	at := func(q float64) time.Duration { return waits[int(q*float64(len(waits)-1))] }
	return at(0.5), at(0.99)
}

// TestRenewalsDoNotFanOut: on both backends, a task renewing every 100 ms
// for 6 s (60 renewals, the shape of a 60 s task with 1 s pings) reaches
// another worker's change stream as at most 4 events: its publish, claim
// and finish.
func TestRenewalsDoNotFanOut(t *testing.T) {
	for _, backend := range []string{"sqlite", "mongodb"} {
		t.Run(backend, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			var holder, other task.Store
			if backend == "sqlite" {
				path := filepath.Join(t.TempDir(), "renew.db")
				for _, p := range []*task.Store{&holder, &other} {
					st, err := sqlitestore.Open(ctx, path, nil)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { st.Close() })
					*p = st
				}
			} else {
				uri := sharedMongoDB(t)
				holder, other = openMongoStore(t, ctx, uri, nil), openMongoStore(t, ctx, uri, nil)
			}
			cs, err := other.Watch(ctx, task.WatchParams{SkipQuiet: true})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			mux := consumer.NewMux()
			mux.RegisterFunc("long", func(ctx context.Context, job *consumer.Job) error {
				select {
				case <-time.After(6 * time.Second):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			c, err := consumer.New(consumer.Config{Store: holder, Handler: mux, WorkerID: "holder"})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer c.Stop(context.Background())
			_, _, err = task.Publish(ctx, holder, task.PublishParams{Key: "long-1", Kind: "long",
				Options: task.Options{PingInterval: 100 * time.Millisecond, WorkerTimeout: 400 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			events := 0
			for {
				ev, err := cs.Next(ctx)
				if err != nil {
					t.Fatalf("after %d events: %v", events, err)
				}
				if ev.Key != "long-1" {
					continue
				}
				events++
				if ev.Task != nil && ev.Task.State.Finished() {
					break
				}
			}
			got, err := other.Get(ctx, "long-1")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d writes (version), %d change events to the other worker", backend, got.Version, events)
			if got.State != task.StateSucceeded || got.Version < 40 {
				t.Fatalf("task %s at version %d; want succeeded after its renewals (version 40 or more)", got.State, got.Version)
			}
			if events > 4 {
				t.Fatalf("%d change events reached the other worker for one renewing task; want at most 4", events)
			}
		})
	}
}

// publishPaced publishes n noop tasks keyed c00000, c00001, … one every
// interval.
func publishPaced(b *testing.B, st task.Store, n int, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		if _, _, err := task.Publish(context.Background(), st, task.PublishParams{Key: fmt.Sprintf("c%05d", i), Kind: "noop"}); err != nil {
			b.Fatal(err)
		}
	}
}
