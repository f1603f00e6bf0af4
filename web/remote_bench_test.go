package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/web"
)

// BenchmarkRemoteDrain drains 20,000 noop tasks, published in batches,
// through the remote worker protocol over HTTP into an embedded store on
// disk, as a worker of 32 slots would, two ways: one finish call per task
// (one claimer asking for as many tasks as it has free slots), and one
// finish-many call per batch that claims the next batch in the same round
// trip. It prints tasks/s of each; server and client share the process.
// The client packages' own figures: go test ./tests -bench RemoteWorkers.
//
//	go test ./web -run '^$' -bench RemoteDrain -benchtime 1x
func BenchmarkRemoteDrain(b *testing.B) {
	for range b.N {
		benchRemoteDrain(b, false)
		benchRemoteDrain(b, true)
	}
}

func benchRemoteDrain(b *testing.B, many bool) {
	const tasks, slots = 20000, 32
	{
		s := tempStore(b)
		h, err := web.NewHandler(web.Config{Store: s})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(h)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: slots + 1}}
		post := func(method, path string, body any, out any) {
			bb, _ := json.Marshal(body)
			req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(bb))
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 && resp.StatusCode != 201 {
				b.Fatalf("%s %s: %d", method, path, resp.StatusCode)
			}
			if out != nil {
				if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
					b.Fatal(err)
				}
			}
		}
		for n := 0; n < tasks; n += web.MaxBatchTasks {
			var ts []map[string]any
			for i := n; i < n+web.MaxBatchTasks && i < tasks; i++ {
				ts = append(ts, map[string]any{"key": fmt.Sprintf("t%05d", i), "kind": "noop"})
			}
			post("POST", "/api/v1/tasks/batch", map[string]any{"tasks": ts}, nil)
		}
		post("PUT", "/api/v1/workers/bench", map[string]any{"instance": "i", "kinds": []string{"noop"}, "concurrency": slots}, nil)
		stopBeat := make(chan struct{})
		go func() {
			for {
				select {
				case <-stopBeat:
					return
				case <-time.After(2 * time.Second):
					post("PUT", "/api/v1/workers/bench", map[string]any{"instance": "i", "kinds": []string{"noop"}, "concurrency": slots}, nil)
				}
			}
		}()
		began := time.Now()
		if many {
			var out struct{ Jobs []claimedJob }
			post("POST", "/api/v1/workers/bench/claim", map[string]any{"instance": "i", "max": slots, "wait_ms": 1000}, &out)
			for done := 0; done < tasks; {
				var outcomes []map[string]any
				for _, j := range out.Jobs {
					outcomes = append(outcomes, map[string]any{"key": j.Key, "attempt": j.Attempt, "outcome": "succeeded"})
				}
				done += len(out.Jobs)
				out.Jobs = nil
				post("POST", "/api/v1/workers/bench/finish", map[string]any{"instance": "i", "outcomes": outcomes,
					"claim": map[string]any{"max": slots, "wait_ms": 1000}}, &out)
			}
			elapsed := time.Since(began)
			close(stopBeat)
			fmt.Printf("remote drain over HTTP, embedded store, 32 slots, finish-many with claim: %d tasks in %s, %.0f tasks/s\n", tasks, elapsed.Round(time.Millisecond), tasks/elapsed.Seconds())
			b.ReportMetric(tasks/elapsed.Seconds(), "many-tasks/s")
			srv.Close()
			return
		}
		free := make(chan struct{}, slots)
		for range slots {
			free <- struct{}{}
		}
		var wg sync.WaitGroup
		done := 0
		for done < tasks {
			<-free
			n := 1
			for len(free) > 0 && n < slots {
				<-free
				n++
			}
			var out struct{ Jobs []claimedJob }
			post("POST", "/api/v1/workers/bench/claim", map[string]any{"instance": "i", "max": n, "wait_ms": 1000}, &out)
			for range n - len(out.Jobs) {
				free <- struct{}{}
			}
			for _, j := range out.Jobs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					post("POST", "/api/v1/workers/bench/jobs/"+j.Key+"/finish", map[string]any{"instance": "i", "attempt": j.Attempt, "outcome": "succeeded"}, nil)
					free <- struct{}{}
				}()
			}
			done += len(out.Jobs)
		}
		wg.Wait()
		elapsed := time.Since(began)
		close(stopBeat)
		b.ReportMetric(tasks/elapsed.Seconds(), "single-tasks/s")
		fmt.Printf("remote drain over HTTP, embedded store, 32 slots, a finish per task: %d tasks in %s, %.0f tasks/s\n", tasks, elapsed.Round(time.Millisecond), tasks/elapsed.Seconds())
		srv.Close()
	}
}
