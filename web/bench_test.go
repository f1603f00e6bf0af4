package web_test

// Benchmarks that print figures (not run by `go test` without -bench):
//
//	go test ./web -run XXX -bench BenchmarkList1M -benchtime 200x
//	go test ./web -run XXX -bench BenchmarkSSEFanout -benchtime 1x
//
// BenchmarkList1M fills an SQLite store with 1,000,000 tasks
// (LEASEPOOL_BENCH_TASKS to change; LEASEPOOL_BENCH_DB=path keeps the file
// and reuses it on the next run) and measures GET /api/v1/tasks through
// the HTTP handler: p50 and p99 per request, first pages and deep pages,
// with and without filters.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// benchTask is task i of the 1M fixture: 10 kinds, 50 workers, payload
// tags; 70% succeeded, 20% pending, 5% failed, 5% running.
func benchTask(i int, now time.Time) *task.Task {
	t, err := task.NewTask(task.PublishParams{
		Key: fmt.Sprintf("job-%07d", i), Kind: fmt.Sprintf("k%d", i%10),
		Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"tag":"t%02d","note":"some text to search in"}`, i, i%100)),
	}, now.Add(time.Duration(i)*time.Millisecond))
	if err != nil {
		panic(err)
	}
	w := task.Attempt{WorkerID: fmt.Sprintf("w%02d", i%50), Attempt: 1, StartedAt: now, LeaseUntil: now.Add(time.Hour)}
	switch r := i % 20; {
	case r < 14:
		w.State, w.EndedAt = task.AttemptSuccess, now
	case r < 18:
		return t
	case r == 18:
		t.MaxUnexpectedRetries = 0
		w.State, w.EndedAt = task.AttemptFail, now
	default:
		w.State = task.AttemptRunning
	}
	t.AttemptsStarted = 1
	t.Attempts = []task.Attempt{w}
	t.Recompute(now)
	return t
}

// benchStore opens (and fills when empty) the store of n tasks.
func benchStore(b *testing.B, n int) task.Store {
	b.Helper()
	path := os.Getenv("LEASEPOOL_BENCH_DB")
	if path == "" {
		path = filepath.Join(b.TempDir(), "bench.db")
	}
	s, err := store.Open(context.Background(), "sqlite:"+path, store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	st, err := s.Stats(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	have := 0
	for _, c := range st.Counts {
		have += int(c.N)
	}
	if have >= n {
		return s
	}
	start := time.Now()
	now := s.Now().Add(-time.Duration(n) * time.Millisecond)
	var next atomic.Int64
	next.Store(int64(have))
	var wg sync.WaitGroup
	for range 128 { // many writers: the store group-commits them (maxBatch 128)
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if _, _, err := s.Insert(context.Background(), benchTask(i, now)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("inserted %d tasks in %s (%.0f/s)\n", n-have, time.Since(start).Round(time.Millisecond), float64(n-have)/time.Since(start).Seconds())
	return s
}

func BenchmarkList1M(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("LEASEPOOL_BENCH_TASKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	s := benchStore(b, n)
	h, err := web.NewHandler(web.Config{Store: s, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	all, err := s.List(context.Background(), task.ListQuery{Desc: true, Limit: 1})
	if err != nil || len(all) == 0 {
		b.Fatal(err)
	}
	top := all[0].Seq
	mid, deep := web.Cursor(false, top/2), web.Cursor(false, top/100)
	cases := []struct{ name, query string }{
		{"first", ""},
		{"first_limit1000", "limit=1000"},
		{"deep_middle", "cursor=" + mid},
		{"deep_oldest", "cursor=" + deep},
		{"asc_middle", "order=asc&cursor=" + web.Cursor(true, top/2)},
		{"state_pending_first", "state=pending"},
		{"state_failed_middle", "state=failed&cursor=" + mid},
		{"kind_first", "kind=k3"},
		{"kind_state_middle", "kind=k9&state=running&cursor=" + mid},
		{"key_prefix", "key_prefix=job-05"},
		{"key_prefix_rare", "key_prefix=job-00001"},
		{"key_prefix_all", "key_prefix=job-"},
		{"worker_middle", "worker=w07&cursor=" + mid},
		{"text_common", "text=t42"},
		{"created_after_middle", "created_after=" + all[0].CreatedAt.Add(-time.Duration(n/2)*time.Millisecond).Format(time.RFC3339Nano)},
		{"stats", ""}, // GET /api/v1/stats
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			url := srv.URL + "/api/v1/tasks?" + strings.ReplaceAll(c.query, "+", "%2B")
			if c.name == "stats" {
				url = srv.URL + "/api/v1/stats"
			}
			var lat []time.Duration
			got := 0
			for b.Loop() {
				t0 := time.Now()
				resp, err := http.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				var body struct {
					Tasks  []json.RawMessage `json:"tasks"`
					Counts []json.RawMessage `json:"counts"`
				}
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("%s: %d %v", c.query, resp.StatusCode, err)
				}
				lat = append(lat, time.Since(t0))
				got = len(body.Tasks) + len(body.Counts)
			}
			p50, p99 := quantile(lat, 0.50), quantile(lat, 0.99)
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			fmt.Printf("%-27s items %4d  p50 %8.2fms  p99 %8.2fms  (%d requests, %d tasks in store)\n",
				c.name, got, ms(p50), ms(p99), len(lat), n)
		})
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkSSEFanout opens 100 event streams (LEASEPOOL_BENCH_SUBSCRIBERS)
// and publishes 2,000 tasks (LEASEPOOL_BENCH_EVENTS) from 8 goroutines, as
// fast as the store takes them or at LEASEPOOL_BENCH_RATE a second, then
// reports the events delivered per second across all streams and the lag
// from the publish call to each stream's receipt.
func BenchmarkSSEFanout(b *testing.B) {
	subs, events := envInt(b, "LEASEPOOL_BENCH_SUBSCRIBERS", 100), envInt(b, "LEASEPOOL_BENCH_EVENTS", 2000)
	rate := envInt(b, "LEASEPOOL_BENCH_RATE", 0)
	for b.Loop() {
		fanout(b, subs, events, rate)
	}
}

func envInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	return def
}

func fanout(b *testing.B, subs, events, rate int) {
	s, err := store.Open(context.Background(), "sqlite:"+filepath.Join(b.TempDir(), "fan.db"), store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	h, err := web.NewHandler(web.Config{Store: s, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent sync.Map // key -> time the publish started
	lags := make([][]time.Duration, subs)
	var ready, done sync.WaitGroup
	for i := range subs {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			lags[i] = subscribe(ctx, b, srv.URL+"/api/v1/events?type=published", events, &sent, ready.Done)
		}()
	}
	ready.Wait()
	start := time.Now()
	var next atomic.Int64
	var pubs sync.WaitGroup
	for range 8 {
		pubs.Go(func() {
			for i := int(next.Add(1) - 1); i < events; i = int(next.Add(1) - 1) {
				if rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate)))) // publish at the rate the bench is about
				}
				key := fmt.Sprintf("e%06d", i)
				sent.Store(key, time.Now())
				if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: key, Kind: "k"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	pubs.Wait()
	published := time.Since(start)
	done.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lags {
		all = append(all, l...)
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "events/s")
	b.ReportMetric(ms(quantile(all, 0.99)), "lag-p99-ms")
	fmt.Printf("sse fan-out (rate %d/s, 0: flat out): %d subscribers x %d events = %d delivered in %s (%.0f events/s; publishing took %s); lag p50 %.1fms p99 %.1fms max %.1fms\n",
		rate, subs, events, len(all), elapsed.Round(time.Millisecond), float64(len(all))/elapsed.Seconds(), published.Round(time.Millisecond),
		ms(quantile(all, 0.5)), ms(quantile(all, 0.99)), ms(quantile(all, 1)))
}

// subscribe reads want published events from url and returns each one's
// lag; ready is called once the stream is open.
func subscribe(ctx context.Context, b *testing.B, url string, want int, sent *sync.Map, ready func()) []time.Duration {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ready()
		b.Error(err)
		return nil
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	var lags []time.Duration
	first := true
	for len(lags) < want {
		line, err := rd.ReadString('\n')
		if err != nil {
			if err != io.EOF {
				b.Error(err)
			}
			break
		}
		if first && line == "\n" {
			first = false
			ready() // the position block: the stream is following
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct{ Key string }
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		if t0, ok := sent.Load(ev.Key); ok {
			lags = append(lags, time.Since(t0.(time.Time)))
		}
	}
	return lags
}
