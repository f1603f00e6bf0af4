package tests

// Figures for the MongoDB traffic of worker processes, printed on demand
// (not a timed test): round trips, change events and bytes per task and
// per worker with 1, 2, 4 and 8 idle worker processes while tasks are
// published at 100/s, read from each worker's leasepool_store_* counters
// (a command monitor on its driver), so they hold on a busy machine.
//
//	eval "$(tests/servers up)"    # export its LEASEPOOL_TEST_* lines
//	go test ./tests -run '^$' -bench MongoTraffic -benchtime 1x
//
// Each run starts a wire test server of its own (in memory).

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// series maps a sample's name and labels, as /metrics prints them, to its
// value summed over workers.
type series map[string]float64

// scrapeSeries sums the samples named with one of prefixes over the
// workers at addrs.
func scrapeSeries(t testing.TB, addrs []string, prefixes ...string) series {
	t.Helper()
	s := series{}
	for _, addr := range addrs {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatalf("scrape %s: %v", addr, err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") {
				continue
			}
			for _, p := range prefixes {
				if strings.HasPrefix(line, p) {
					i := strings.LastIndexByte(line, ' ')
					if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
						s[line[:i]] += v
					}
					break
				}
			}
		}
		resp.Body.Close()
	}
	return s
}

func (s series) minus(o series) series {
	d := series{}
	for k, v := range s {
		d[k] = v - o[k]
	}
	return d
}

func (s series) commands(name string) float64 {
	return s[`leasepool_store_commands_total{command="`+name+`"}`]
}

func (s series) bytes(name, direction string) float64 {
	return s[`leasepool_store_bytes_total{command="`+name+`",direction="`+direction+`"}`]
}

// sum adds the samples of name (any labels) whose labels contain has.
func (s series) sum(name, has string) float64 {
	var n float64
	for k, v := range s {
		if (k == name || strings.HasPrefix(k, name+"{")) && strings.Contains(k, has) {
			n += v
		}
	}
	return n
}

var trafficPrefixes = []string{"leasepool_store_commands_total", "leasepool_store_bytes_total",
	"leasepool_store_change_events_total", "leasepool_claim_conflicts_total", "leasepool_tasks_claimed_total"}

// The commands the table shows a column each; the rest are "other".
var trafficColumns = []string{"update", "find", "getMore", "aggregate"}

type trafficRow struct {
	workers, tasks int
	run, idle      series
	runFor         time.Duration
}

// TestWorkerStoreTraffic: `leasepool worker --metrics-addr` on MongoDB
// exports its store traffic: the claims and finishes of the tasks it ran
// among its update commands, their bytes both ways, and the change events
// of their writes.
func TestWorkerStoreTraffic(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	uri := sharedMongoDB(t)
	st := openMongoStore(t, ctx, uri, nil)
	addr := freeAddr(t)
	startWorker(t, uri, "traffic", "--kinds", "noop", "--metrics-addr", addr)
	// The worker opens its change stream before it first looks for tasks.
	eventually(t, 30*time.Second, "the worker's change stream", func() bool {
		text, _ := scrape("http://"+addr+"/metrics", "")
		return sample(text, `leasepool_store_commands_total{command="getMore"}`) > 0
	})
	const tasks = 3
	for i := range tasks {
		if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: fmt.Sprintf("t%d", i), Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
	}
	waitSucceeded(t, st, tasks)
	var s series
	eventually(t, 20*time.Second, "the tasks' writes among the worker's change events", func() bool {
		s = scrapeSeries(t, []string{addr}, trafficPrefixes...)
		// Each task's publish, claim and finish.
		return s.sum("leasepool_store_change_events_total", "") >= 3*tasks
	})
	if got := s.commands("update"); got < 2 {
		t.Errorf("update commands %v after %d tasks claimed and finished, want at least 2 (claims and finishes share batches)", got, tasks)
	}
	for _, dir := range []string{"sent", "received"} {
		if got := s.bytes("getMore", dir); got <= 0 {
			t.Errorf("getMore bytes %s: %v, want some", dir, got)
		}
	}
	if got := s.sum("leasepool_store_bytes_total", `direction="received"`); got < 3*tasks*200 {
		t.Errorf("%v bytes received in all, want at least the %d events' documents", got, 3*tasks)
	}
}

// BenchmarkMongoTraffic prints the MongoDB traffic of idle worker
// processes per task and per worker, and their traffic while idle.
func BenchmarkMongoTraffic(b *testing.B) {
	bin := fastBin(b)
	const tasks, interval, idleFor = 200, 10 * time.Millisecond, 3 * time.Second
	var rows []trafficRow
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("workers-%d", n), func(b *testing.B) {
			uri := freshMongoURI(b)
			st := openScalingMongo(b, uri)
			fw := startFigureWorkers(b, bin, uri, n, 4, nil)
			waitLive(b, st, n)
			// A scrape reads the store's gauges (at most once per
			// metrics.StoreConfig.MaxAge, 5 s): this one does, so that
			// the idle spell's two scrapes are served from that read and
			// the spell counts the workers' own traffic only.
			scrapeSeries(b, fw.addrs, trafficPrefixes...)
			s0 := scrapeSeries(b, fw.addrs, trafficPrefixes...)
			time.Sleep(idleFor) // the idle spell whose traffic is measured
			s1 := scrapeSeries(b, fw.addrs, trafficPrefixes...)
			start := time.Now()
			publishPaced(b, st, tasks, interval)
			waitSucceeded(b, st, tasks)
			// Every stream has heard every write once its count stops
			// moving.
			var s2 series
			testutil.SettlesEvery(b, 10*time.Second, 200*time.Millisecond, 200*time.Millisecond, "the change events counted to stop moving", func() int64 {
				s2 = scrapeSeries(b, fw.addrs, trafficPrefixes...)
				return int64(s2.sum("leasepool_store_change_events_total", ""))
			})
			row := trafficRow{workers: n, tasks: tasks, run: s2.minus(s1), idle: s1.minus(s0), runFor: time.Since(start)}
			if row.run.sum("leasepool_store_change_events_total", "") < float64(tasks*n) {
				b.Fatalf("%v change events counted for %d tasks and %d workers: the workers' traffic counters do not count",
					row.run.sum("leasepool_store_change_events_total", ""), tasks, n)
			}
			rows = append(rows, row)
			fw.stop()
		})
	}
	printTraffic(rows, idleFor)
}

func printTraffic(rows []trafficRow, idleFor time.Duration) {
	fmt.Println()
	fmt.Println("Per task and per worker process, while 200 noop tasks are published at 100/s (from the end of an idle spell to the last event heard, idle polls included):")
	fmt.Println()
	fmt.Println("| worker processes | round trips | update | find | getMore | aggregate | other | change events | KB sent | KB received | bytes per change event | round trips per task, all workers | claim conflicts per task |")
	fmt.Println("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		per := float64(r.tasks * r.workers)
		all := r.run.sum("leasepool_store_commands_total", "")
		events := r.run.sum("leasepool_store_change_events_total", "")
		// getMore replies carry the events; as long idle, the polls'
		// empty replies alone would have come to idlePolls bytes.
		idlePolls := r.idle.bytes("getMore", "received") / idleFor.Seconds() * r.runFor.Seconds()
		fmt.Printf("| %d | %.2f | %s | %.2f | %.2f | %.2f | %.0f | %.2f | %.3f |\n", r.workers, all/per, commandColumns(r.run, per, "%.2f"),
			events/per,
			r.run.sum("leasepool_store_bytes_total", `direction="sent"`)/per/1000,
			r.run.sum("leasepool_store_bytes_total", `direction="received"`)/per/1000,
			(r.run.bytes("getMore", "received")-idlePolls)/events,
			all/float64(r.tasks), r.run.sum("leasepool_claim_conflicts_total", "")/float64(r.tasks))
	}
	fmt.Println()
	fmt.Printf("Per idle worker process and second (a %s spell before the tasks):\n\n", idleFor)
	fmt.Println("| worker processes | round trips | update | find | getMore | aggregate | other | KB sent | KB received |")
	fmt.Println("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range rows {
		per := float64(r.workers) * idleFor.Seconds()
		fmt.Printf("| %d | %.1f | %s | %.2f | %.2f |\n", r.workers, r.idle.sum("leasepool_store_commands_total", "")/per,
			commandColumns(r.idle, per, "%.1f"),
			r.idle.sum("leasepool_store_bytes_total", `direction="sent"`)/per/1000,
			r.idle.sum("leasepool_store_bytes_total", `direction="received"`)/per/1000)
	}
}

// commandColumns is the table's command columns of s, each divided by
// per, the last one "other".
func commandColumns(s series, per float64, format string) string {
	cols := make([]string, 0, len(trafficColumns)+1)
	named := 0.0
	for _, c := range trafficColumns {
		cols = append(cols, fmt.Sprintf(format, s.commands(c)/per))
		named += s.commands(c)
	}
	cols = append(cols, fmt.Sprintf(format, (s.sum("leasepool_store_commands_total", "")-named)/per))
	return strings.Join(cols, " | ")
}
