package web_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/leasepool/leasepool/web"
)

// BenchmarkBatchPublish publishes batches of web.MaxBatchTasks new tasks
// through POST /api/v1/tasks/batch, over HTTP, into an embedded store on
// disk, and prints tasks/s:
//
//	go test ./web -run '^$' -bench BatchPublish -benchtime 1x
func BenchmarkBatchPublish(b *testing.B) {
	s := tempStore(b)
	h, err := web.NewHandler(web.Config{Token: token, Store: s})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	const batches = 5
	bodies := make([][]byte, 0, batches*b.N)
	for n := range batches * b.N {
		var buf bytes.Buffer
		buf.WriteString(`{"tasks":[`)
		for i := range web.MaxBatchTasks {
			if i > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"key":"b%d-%05d","kind":"noop","payload":{"i":%d}}`, n, i, i)
		}
		buf.WriteString(`]}`)
		bodies = append(bodies, buf.Bytes())
	}
	b.ResetTimer()
	began := time.Now()
	for _, body := range bodies {
		req, _ := http.NewRequest("POST", srv.URL+"/api/v1/tasks/batch", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var out web.BatchResponse
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || out.Inserted != web.MaxBatchTasks {
			b.Fatalf("batch: %v, %d inserted", err, out.Inserted)
		}
	}
	elapsed := time.Since(began)
	n := float64(len(bodies) * web.MaxBatchTasks)
	b.ReportMetric(n/elapsed.Seconds(), "tasks/s")
	fmt.Printf("batch publish over HTTP into SQLite: %.0f tasks in %s, %.0f tasks/s\n", n, elapsed.Round(time.Millisecond), n/elapsed.Seconds())
}
