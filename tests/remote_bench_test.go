package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// BenchmarkRemoteWorkers measures one remote worker process per client
// package at concurrency 32 through `leasepool serve` (built without the
// race detector) over an embedded store on disk: the tasks/s of draining
// 20,000 noop-handler tasks published beforehand, then the publish→start
// latency of 1,000 tasks published one by one at 200/s to the idle
// worker (p50, p99, from the stored claim times). It prints the figures:
//
//	go test ./tests -run '^$' -bench RemoteWorkers -benchtime 1x
func BenchmarkRemoteWorkers(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "leasepool")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/leasepool").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	for _, lang := range []string{"ts", "py"} {
		for range b.N {
			benchRemoteWorker(b, bin, lang)
		}
	}
}

func benchRemoteWorker(b *testing.B, bin, lang string) {
	const tasks, concurrency, latencyTasks = 20000, 32, 1000
	dir := b.TempDir()
	storeURL := "sqlite:" + filepath.Join(dir, "s.db")
	addr := freeAddr(b)
	serve := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "serve", "--listen", addr)
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	url := "http://" + addr
	testutil.EventuallyEvery(b, 30*time.Second, 20*time.Millisecond, "serve to answer", func() bool {
		code, err := httpGet(url + "/api/v1/stats")
		return err == nil && code == 200
	})
	post := func(path string, body any) {
		bb, _ := json.Marshal(body)
		resp, err := http.Post(url+path, "application/json", bytes.NewReader(bb))
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			b.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	// The backlog, published by the language's own client.
	publishMS := clientPublishMany(b, lang, url, tasks)
	st, err := store.Open(b.Context(), storeURL, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	succeeded := func() int64 {
		s, err := st.Stats(b.Context())
		if err != nil {
			return -1
		}
		return s.ByState()[task.StateSucceeded]
	}

	began := time.Now()
	w := startBenchWorker(b, lang, url, concurrency)
	defer func() { w.Process.Kill(); w.Wait() }()
	testutil.EventuallyEvery(b, 10*time.Minute, 50*time.Millisecond, "the backlog to drain", func() bool { return succeeded() == tasks })
	drain := time.Since(began)

	// Latency: tasks published one at a time to the idle worker.
	tick := time.NewTicker(5 * time.Millisecond)
	for i := range latencyTasks {
		<-tick.C
		post("/api/v1/tasks", map[string]any{"key": fmt.Sprintf("l%04d", i), "kind": "noop"})
	}
	tick.Stop()
	testutil.EventuallyEvery(b, time.Minute, 50*time.Millisecond, "the latency tasks to finish", func() bool { return succeeded() == tasks+latencyTasks })
	var lat []time.Duration
	for i := range latencyTasks {
		doc, err := st.Get(b.Context(), fmt.Sprintf("l%04d", i))
		if err != nil || len(doc.Attempts) == 0 {
			b.Fatalf("l%04d: %v", i, err)
		}
		lat = append(lat, doc.Attempts[0].StartedAt.Sub(doc.CreatedAt))
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))].Round(100 * time.Microsecond) }
	// The start counted from the worker process's start: it includes
	// Node's or Python's start-up, a few hundred ms at most.
	fmt.Printf("%s client: publish-many %d tasks in %d ms, %.0f tasks/s; one remote worker, concurrency %d: drained in %s, %.0f tasks/s; publish→claim p50 %s, p99 %s (%d tasks at 200/s)\n",
		lang, tasks, publishMS, float64(tasks)/(float64(publishMS)/1000), concurrency,
		drain.Round(time.Millisecond), tasks/drain.Seconds(), p(0.50), p(0.99), latencyTasks)
	b.ReportMetric(tasks/drain.Seconds(), lang+"-tasks/s")
}

// clientPublishMany publishes n noop tasks (keys d00000...) with lang's
// client package's publish-many through the serve at url, and returns
// the milliseconds the call took, as the client program measured it.
func clientPublishMany(b *testing.B, lang, url string, n int) int64 {
	var cmd *exec.Cmd
	if lang == "ts" {
		cmd = exec.Command("node", "-e", `
const { Client } = require(process.argv[1]);
const n = Number(process.argv[3]);
const tasks = Array.from({ length: n }, (_, i) => ({ key: "d" + String(i).padStart(5, "0"), kind: "noop" }));
const began = Date.now();
new Client({ url: process.argv[2] }).publishMany(tasks).then((r) => {
  if (r.inserted !== n) throw new Error("inserted " + r.inserted);
  console.log(Date.now() - began);
});`, clientDir("typescript"), url, fmt.Sprint(n))
	} else {
		cmd = exec.Command("python3", "-c", `
import sys, time
sys.path.insert(0, sys.argv[1])
from leasepool import Client
n = int(sys.argv[3])
tasks = [{"key": "d%05d" % i, "kind": "noop"} for i in range(n)]
began = time.monotonic()
r = Client(sys.argv[2]).publish_many(tasks)
assert r["inserted"] == n, r["inserted"]
print(int((time.monotonic() - began) * 1000))
`, filepath.Join(clientDir("python"), "src"), url, fmt.Sprint(n))
	}
	out, err := cmd.CombinedOutput()
	var ms int64
	if _, scanErr := fmt.Sscan(string(out), &ms); err != nil || scanErr != nil {
		b.Fatalf("%s publish-many: %v: %s", lang, err, out)
	}
	return ms
}

// startBenchWorker starts lang's record-worker recording to /dev/null: its
// handler returns at once.
func startBenchWorker(b *testing.B, lang, url string, concurrency int) *exec.Cmd {
	args := []string{"--url", url, "--id", "bench-" + lang, "--kinds", "noop", "--concurrency", fmt.Sprint(concurrency), "--record", os.DevNull}
	var cmd *exec.Cmd
	if lang == "ts" {
		cmd = exec.Command("node", append([]string{filepath.Join(clientDir("typescript"), "examples", "record-worker.js")}, args...)...)
	} else {
		cmd = exec.Command("python3", append([]string{filepath.Join(clientDir("python"), "examples", "record_worker.py")}, args...)...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

// BenchmarkPublishFile publishes 100,000 JSON lines with `leasepool
// publish --file` (built without the race detector) into an embedded
// store on disk, and prints tasks/s:
//
//	go test ./tests -run '^$' -bench PublishFile -benchtime 1x
func BenchmarkPublishFile(b *testing.B) {
	const lines = 100000
	dir := b.TempDir()
	bin := filepath.Join(dir, "leasepool")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/leasepool").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	var buf bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&buf, `{"key":"f%06d","kind":"noop","payload":{"i":%d}}`+"\n", i, i)
	}
	file := filepath.Join(dir, "tasks.jsonl")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	for n := range b.N {
		storeURL := "sqlite:" + filepath.Join(dir, fmt.Sprintf("p%d.db", n))
		began := time.Now()
		if out, err := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "publish", "--file", file).CombinedOutput(); err != nil {
			b.Fatalf("publish --file: %v\n%s", err, out)
		}
		elapsed := time.Since(began)
		fmt.Printf("leasepool publish --file: %d lines in %s, %.0f tasks/s (process start and store open included)\n",
			lines, elapsed.Round(time.Millisecond), lines/elapsed.Seconds())
		b.ReportMetric(lines/elapsed.Seconds(), "tasks/s")
	}
}
