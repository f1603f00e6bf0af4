package tests

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns the exposition text of url, or "" on any failure.
func scrape(url, token string) (string, int) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

// sample returns the value of the sample line that starts with series
// (name and labels as exposed), or -1.
func sample(text, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// TestWorkerMetricsEndpoint runs `leasepool worker --metrics-addr` on
// tasks with known outcomes and scrapes it: three succeed, one fails for
// good, one fails once and is retried; the registry shows one live worker.
// It also checks that a bad address fails the worker at once, and that
// `leasepool serve` exposes /metrics behind its token.
func TestWorkerMetricsEndpoint(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	url := "sqlite:" + dbPath
	publish := func(key, kind, payload string, retries int) {
		p := task.PublishParams{Key: key, Kind: kind, Payload: json.RawMessage(payload)}
		p.MaxUnexpectedRetries = retries
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			t.Fatalf("publish %s: %v", key, err)
		}
	}
	for _, k := range []string{"ok-1", "ok-2", "ok-3"} {
		publish(k, "noop", "", 0)
	}
	publish("doomed", "sleep", `{"fail":true}`, task.NoRetries)
	// Fails while its marker file is missing, creating it: the retry succeeds.
	marker := filepath.Join(t.TempDir(), "marker")
	publish("flaky", "exec", `{"argv":["sh","-c","test -e `+marker+` || { touch `+marker+`; exit 1; }"]}`, 3)

	out, err := exec.Command(leasepoolBin(t), "--store", url, "worker", "--metrics-addr", "nohost").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--metrics-addr") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("worker --metrics-addr nohost: exit %d, output %q; want exit 2 and one line naming the flag", code, out)
	}

	addr := freeAddr(t)
	startWorker(t, url, "w1", "--kinds", "exec,noop,sleep", "--metrics-addr", addr, "--backoff", "10ms")
	finished := func(text, kind, outcome string) float64 {
		return sample(text, `leasepool_tasks_finished_total{kind="`+kind+`",outcome="`+outcome+`"}`)
	}
	var text string
	eventually(t, 60*time.Second, "the outcomes on /metrics", func() bool {
		text, _ = scrape("http://"+addr+"/metrics", "")
		return finished(text, "noop", "succeeded") == 3 && finished(text, "sleep", "failed") == 1 &&
			finished(text, "exec", "retried") == 1 && finished(text, "exec", "succeeded") == 1 &&
			// The store's figures are up to 5 s old: the first scrape may
			// predate the worker's registration.
			sample(text, "leasepool_workers_live") == 1
	})
	// The store's gauges, up to 5 s behind.
	eventually(t, 30*time.Second, "the store gauges on /metrics", func() bool {
		text, _ = scrape("http://"+addr+"/metrics", "")
		return sample(text, `leasepool_tasks{kind="noop",state="succeeded"}`) == 3 &&
			sample(text, `leasepool_tasks{kind="sleep",state="failed"}`) == 1 &&
			sample(text, `leasepool_tasks{kind="exec",state="succeeded"}`) == 1
	})
	checks := map[string]float64{
		`leasepool_tasks_claimed_total{kind="noop"}`:                                3,
		`leasepool_tasks_claimed_total{kind="exec"}`:                                2,
		`leasepool_handler_duration_seconds_count{kind="noop",outcome="succeeded"}`: 3,
		`leasepool_task_wait_seconds_count{kind="sleep"}`:                           1,
		`leasepool_workers_live`:                                                    1,
		`leasepool_store_up`:                                                        1,
		`leasepool_oldest_ready_task_age_seconds`:                                   0,
	}
	for series, want := range checks {
		if got := sample(text, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
	checkServeMetrics(t, ctx, url)
}

// checkServeMetrics starts `leasepool serve` with a token and checks that
// /metrics needs it and then shows the store's gauges.
func checkServeMetrics(t *testing.T, ctx context.Context, url string) {
	addr := freeAddr(t)
	cmd := exec.CommandContext(ctx, leasepoolBin(t), "--store", url, "--log-level", "warn", "serve", "--listen", addr, "--token", "s3cret")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var text string
	eventually(t, 30*time.Second, "serve's /metrics", func() bool {
		var code int
		text, code = scrape("http://"+addr+"/metrics", "s3cret")
		return code == http.StatusOK
	})
	if got := sample(text, "leasepool_workers_live"); got != 1 {
		t.Errorf("serve: leasepool_workers_live = %v, want 1", got)
	}
	if got := sample(text, `leasepool_tasks{kind="noop",state="succeeded"}`); got != 3 {
		t.Errorf("serve: leasepool_tasks{noop,succeeded} = %v, want 3", got)
	}
	if _, code := scrape("http://"+addr+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("serve: /metrics without the token: %d, want 401", code)
	}
	if _, code := scrape("http://"+addr+"/metrics", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("serve: /metrics with a wrong token: %d, want 401", code)
	}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
