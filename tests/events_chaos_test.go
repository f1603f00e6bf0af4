package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// eventLine is the part of a `leasepool events --json` line the test
// reads; lines are compared whole.
type eventLine struct {
	Type  string `json:"event"`
	Key   string `json:"key"`
	Token string `json:"token"`
}

// follower is one `leasepool events --json` process writing to a file.
type follower struct {
	cmd  *exec.Cmd
	path string
}

func startFollower(t *testing.T, store, since string) *follower {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "events-*.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--store", store, "--log-level", "warn", "events", "--json"}
	if since != "" {
		args = append(args, "--since", since)
	}
	cmd := exec.Command(leasepoolBin(t), args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return &follower{cmd: cmd, path: f.Name()}
}

// lines returns the complete lines printed so far (a SIGKILL can cut the
// last one short; a cut line is not an event printed).
func (f *follower) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.path)
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(b, '\n')
	if end < 0 {
		return nil
	}
	ls := strings.Split(string(b[:end]), "\n")
	for _, l := range ls {
		if !strings.HasPrefix(l, "{") {
			t.Fatalf("follower %s printed a line that is no event: %q", f.path, l)
		}
	}
	return ls
}

func parseEvent(t *testing.T, line string) eventLine {
	t.Helper()
	var e eventLine
	if err := json.Unmarshal([]byte(line), &e); err != nil || e.Token == "" {
		t.Fatalf("event line %q: %v (token %q)", line, err, e.Token)
	}
	return e
}

// waitFor waits until f has printed the published event of key and returns
// the index of that line.
func waitFor(t *testing.T, f *follower, key string, d time.Duration) ([]string, int) {
	t.Helper()
	var ls []string
	at := -1
	eventually(t, d, "the published event of "+key, func() bool {
		ls = f.lines(t)
		for i, l := range ls {
			if e := parseEvent(t, l); e.Key == key && e.Type == "published" {
				at = i
				return true
			}
		}
		return false
	})
	return ls, at
}

// TestEventFollowersResumeAcrossChaos is issue 10's event stream proof on
// the embedded store: while worker processes are SIGKILLed and restarted
// under a stream of tasks (successes, failures, retries, takeovers of
// expired leases), `leasepool events --json` followers are SIGKILLed and
// restarted from the token of the last line they printed, again and
// again. What they printed, put together, must equal line for line (same
// events, same tokens, same order) what one uninterrupted follower started
// before printed: a resumed follower neither misses nor repeats an event.
func TestEventFollowersResumeAcrossChaos(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	url := "sqlite:" + dbPath
	publish := func(key, kind, payload string, retries int) {
		p := task.PublishParams{Key: key, Kind: kind, Payload: json.RawMessage(payload)}
		p.PingInterval, p.WorkerTimeout, p.MaxUnexpectedRetries = 250*time.Millisecond, time.Second, retries
		if _, _, err := task.Publish(ctx, store, p); err != nil {
			t.Fatalf("publish %s: %v", key, err)
		}
	}

	// The reference follows from now: publish markers until it has seen
	// one, whose token is where the resumed followers start.
	ref := startFollower(t, url, "")
	var startToken string
	eventually(t, 30*time.Second, "the reference follower to see a marker", func() bool {
		publish(fmt.Sprintf("mark-start-%d", time.Now().UnixNano()), "noop", "", 0)
		var ls []string
		if !testutil.Within(200*time.Millisecond, func() bool { ls = ref.lines(t); return len(ls) > 0 }) {
			return false // the follower was not following yet: another marker
		}
		startToken = parseEvent(t, ls[0]).Token
		return true
	})
	refStart := 1 // the reference's lines after the start marker's

	const n = 80
	for i := range n {
		d := 100 + rand.N(900)
		fail := i%6 == 5
		publish(fmt.Sprintf("ev-%02d", i), "sleep", fmt.Sprintf(`{"duration":"%dms","fail":%v}`, d, fail), 2)
	}
	chaosDone := make(chan struct{})
	var kills int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		kills = eventChaos(t, ctx, store, url, n, chaosDone)
	}()

	// Followers: each is SIGKILLed after 0.3-1.5 s and the next resumes
	// from the last line it printed, until the tasks are done.
	var union []string
	since, restarts := startToken, 0
	cur := startFollower(t, url, since)
	for finished := false; !finished; {
		select {
		case <-chaosDone:
			finished = true
			continue
		case <-time.After(300*time.Millisecond + rand.N(1200*time.Millisecond)):
		}
		cur.cmd.Process.Kill()
		cur.cmd.Wait()
		ls := cur.lines(t)
		union = append(union, ls...)
		if len(ls) > 0 {
			since = parseEvent(t, ls[len(ls)-1]).Token
		}
		restarts++
		cur = startFollower(t, url, since)
	}
	wg.Wait()
	publish("mark-end", "noop", "", 0)
	refLines, refEnd := waitFor(t, ref, "mark-end", 60*time.Second)
	curLines, curEnd := waitFor(t, cur, "mark-end", 60*time.Second)
	union = append(union, curLines[:curEnd+1]...)
	want := refLines[refStart : refEnd+1]

	compareEvents(t, want, union)
	expired := 0
	for _, l := range want {
		if parseEvent(t, l).Type == "expired" {
			expired++
		}
	}
	t.Logf("%d events; %d follower restarts; %d worker kills; %d expired leases taken over", len(want), restarts, kills, expired)
	if restarts < 3 || kills < 2 {
		t.Errorf("too little chaos to prove anything: %d follower restarts, %d worker kills", restarts, kills)
	}
}

// compareEvents checks got equals want line for line, and per key.
func compareEvents(t *testing.T, want, got []string) {
	t.Helper()
	perKey := func(ls []string) map[string][]string {
		m := map[string][]string{}
		for _, l := range ls {
			k := parseEvent(t, l).Key
			m[k] = append(m[k], l)
		}
		return m
	}
	wk, gk := perKey(want), perKey(got)
	for k, ws := range wk {
		if gs := gk[k]; strings.Join(gs, "\n") != strings.Join(ws, "\n") {
			t.Errorf("key %s: the followers printed %d events, the reference %d:\n got %v\nwant %v", k, len(gs), len(ws), gs, ws)
		}
	}
	for k := range gk {
		if _, ok := wk[k]; !ok {
			t.Errorf("key %s: printed by the followers only", k)
		}
	}
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			t.Fatalf("event %d differs:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	if len(want) != len(got) {
		t.Fatalf("the followers printed %d events, the reference %d", len(got), len(want))
	}
}

// eventChaos runs three workers and SIGKILLs one every 1-2 s (restarting
// it 200ms later) until the n ev- tasks are all finished; it closes done
// then and returns the number of kills.
func eventChaos(t *testing.T, ctx context.Context, store task.Store, url string, n int, done chan<- struct{}) int {
	defer close(done)
	ids := []string{"w1", "w2", "w3"}
	workers := map[string]*workerProc{}
	start := func(id string) {
		workers[id] = startWorker(t, url, id, "--concurrency", "3", "--kinds", "sleep,noop", "--backoff", "100ms")
	}
	for _, id := range ids {
		start(id)
	}
	defer func() {
		for _, w := range workers {
			w.cmd.Process.Kill()
			w.cmd.Wait()
		}
	}()
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second + rand.N(time.Second)) // kills at random times: the chaos
		ts, err := store.List(ctx, task.ListQuery{})
		if err != nil {
			t.Error(err)
			return kills
		}
		left := 0
		for _, tk := range ts {
			if strings.HasPrefix(tk.Key, "ev-") && !tk.State.Finished() {
				left++
			}
		}
		if left == 0 {
			return kills
		}
		id := ids[rand.N(len(ids))]
		workers[id].kill(t)
		kills++
		time.Sleep(200 * time.Millisecond) // the restart's gap: part of the chaos
		start(id)
	}
	t.Errorf("the tasks did not finish in 90 s of chaos")
	return kills
}
