package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// clientDir is a client package's directory.
func clientDir(lang string) string {
	d, _ := filepath.Abs(filepath.Join("..", "clients", lang))
	return d
}

var tsBuild sync.Once

// needClients fails (never skips: CI must run this) unless Node and
// Python are here, and builds the TypeScript package when its dist/ is
// missing (tests/run builds it before the suites start).
func needClients(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for the client packages' end-to-end tests: %v", tool, err)
		}
	}
	var err error
	tsBuild.Do(func() {
		dir := clientDir("typescript")
		if _, statErr := os.Stat(filepath.Join(dir, "dist")); statErr == nil {
			return
		}
		for _, args := range [][]string{{"ci", "--no-audit", "--no-fund"}, {"run", "build"}} {
			cmd := exec.Command("npm", args...)
			cmd.Dir = dir
			if out, e := cmd.CombinedOutput(); e != nil {
				err = fmt.Errorf("npm %s: %v\n%s", strings.Join(args, " "), e, out)
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// serveProc is one `leasepool serve` process.
type serveProc struct {
	addr string
	cmd  *exec.Cmd
}

func startServeProc(t *testing.T, storeURL string) *serveProc {
	t.Helper()
	return startServeProcEnv(t, storeURL, nil)
}

// startServeProcEnv is startServeProc with env added to the process's.
func startServeProcEnv(t *testing.T, storeURL string, env []string) *serveProc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(leasepoolBin(t), "--store", storeURL, "--log-level", "warn", "serve", "--listen", addr)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("serve %s log:\n%s", addr, tail(string(b), 3000))
		}
	})
	eventually(t, 30*time.Second, "serve to answer", func() bool {
		resp, err := httpGet("http://" + addr + "/api/v1/stats")
		return err == nil && resp == 200
	})
	return &serveProc{addr: addr, cmd: cmd}
}

// remoteProc is one remote worker process of a client package's
// record-worker program.
type remoteProc struct {
	id, lang string
	cmd      *exec.Cmd
	out      *os.File
}

// startRemoteWorker starts lang's record-worker as worker id against urls,
// appending its handlers' starts, ends and aborts to record, and waits
// until it says it registered.
func startRemoteWorker(t *testing.T, lang, id string, urls []string, kinds string, concurrency int, record string) *remoteProc {
	t.Helper()
	args := []string{"--url", strings.Join(urls, ","), "--id", id, "--kinds", kinds,
		"--concurrency", fmt.Sprint(concurrency), "--record", record}
	var cmd *exec.Cmd
	switch lang {
	case "ts":
		cmd = exec.Command("node", append([]string{filepath.Join(clientDir("typescript"), "examples", "record-worker.js")}, args...)...)
	case "py":
		cmd = exec.Command("python3", append([]string{filepath.Join(clientDir("python"), "examples", "record_worker.py")}, args...)...)
	default:
		t.Fatalf("no client %q", lang)
	}
	out, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &remoteProc{id: id, lang: lang, cmd: cmd, out: out}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			fmt.Fprintln(out, sc.Text())
			if !said && strings.TrimSpace(sc.Text()) == "ready" {
				said = true
				close(ready)
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("%s worker %s log:\n%s", lang, id, tail(string(b), 3000))
		}
		out.Close()
	})
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s worker %s did not say ready", lang, id)
	}
	return p
}

// record is one line a record-worker wrote.
type record struct {
	Event   string `json:"event"`
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	Worker  string `json:"worker"`
	PID     int    `json:"pid"`
	T       int64  `json:"t"` // ms since the epoch
}

func readRecords(t *testing.T, path string) []record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []record
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// TestRemoteWorkersChaos runs 500 tasks on TypeScript and Python worker
// processes through two `serve` processes over one embedded store, while
// workers are SIGKILLed and SIGSTOPped past their leases and one serve is
// SIGKILLed: no task is lost, no two holders that were not frozen ever ran
// one task at once, a frozen worker's handlers are aborted once it is
// resumed and their outcomes never recorded, and a cancelled task's
// handler gets its abort.
func TestRemoteWorkersChaos(t *testing.T) {
	needClients(t)
	dir := t.TempDir()
	storeURL := "sqlite:" + filepath.Join(dir, "s.db")
	serves := []*serveProc{startServeProc(t, storeURL), startServeProc(t, storeURL)}
	urls := []string{"http://" + serves[0].addr, "http://" + serves[1].addr}
	recordPath := filepath.Join(dir, "records.jsonl")

	st, err := store.Open(t.Context(), storeURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	// Published three ways: Go, the TypeScript client, the Python client.
	const perWay, kind = 166, "chaos"
	var goTasks []task.PublishParams
	rng := rand.New(rand.NewPCG(7, 7))
	payload := func() map[string]int { return map[string]int{"ms": 20 + rng.IntN(300)} }
	for i := range perWay + 2 {
		b, _ := json.Marshal(payload())
		goTasks = append(goTasks, task.PublishParams{Key: fmt.Sprintf("go-%03d", i), Kind: kind, Payload: b})
	}
	if _, err := task.PublishMany(t.Context(), st, goTasks); err != nil {
		t.Fatal(err)
	}
	publishWithClients(t, urls[0], kind, perWay, func() map[string]int { return payload() })
	const total = 3*perWay + 2
	// Tasks to cancel while their handlers run.
	var cancelKeys []string
	for i := range 4 {
		key := fmt.Sprintf("cancel-%d", i)
		cancelKeys = append(cancelKeys, key)
		if _, _, err := task.Publish(t.Context(), st, task.PublishParams{Key: key, Kind: kind, Payload: []byte(`{"ms":60000}`)}); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	workers := map[string]*remoteProc{}
	killedAt := map[int]time.Time{} // by pid
	type freeze struct{ from, to time.Time }
	frozen := map[int]freeze{} // by pid
	n := 0
	start := func(lang string) {
		n++
		id := fmt.Sprintf("%s-%d", lang, n)
		p := startRemoteWorker(t, lang, id, urls, kind, 6, recordPath)
		mu.Lock()
		workers[id] = p
		mu.Unlock()
	}
	for _, lang := range []string{"ts", "ts", "py", "py"} {
		start(lang)
	}

	// The cancelled tasks' handlers get their aborts.
	eventually(t, 60*time.Second, "the long tasks to start", func() bool {
		started := map[string]bool{}
		for _, r := range readRecords(t, recordPath) {
			if r.Event == "start" {
				started[r.Key] = true
			}
		}
		for _, k := range cancelKeys {
			if !started[k] {
				return false
			}
		}
		return true
	})
	for _, k := range cancelKeys {
		if _, err := task.Cancel(t.Context(), st, k); err != nil {
			t.Fatal(err)
		}
	}
	// Before any chaos, which could kill their holders first: each
	// handler's abort comes with its next renew.
	eventually(t, 30*time.Second, "the cancelled tasks' handlers to be aborted", func() bool {
		aborted := map[string]bool{}
		for _, r := range readRecords(t, recordPath) {
			if r.Event == "abort" {
				aborted[r.Key] = true
			}
		}
		for _, k := range cancelKeys {
			if !aborted[k] {
				return false
			}
		}
		return true
	})

	// Chaos: 10 SIGKILLs (each worker replaced by a new one), 5 SIGSTOPs
	// past the lease, and one serve SIGKILLed halfway.
	alive := func() []*remoteProc {
		mu.Lock()
		defer mu.Unlock()
		var out []*remoteProc
		for _, p := range workers {
			pid := p.cmd.Process.Pid
			_, dead := killedAt[pid]
			f, stopped := frozen[pid]
			// A process stopped now is left alone: killed while stopped,
			// it could never show that its handlers were aborted.
			if !dead && (!stopped || !f.to.IsZero()) {
				out = append(out, p)
			}
		}
		return out
	}
	actions := []string{"kill", "stop", "kill", "kill", "stop", "kill", "kill", "stop", "kill", "kill", "stop", "kill", "kill", "stop", "kill"}
	var wg sync.WaitGroup
	for i, a := range actions {
		if i == len(actions)/2 {
			serves[0].cmd.Process.Kill()
			serves[0].cmd.Wait()
			t.Logf("serve %s killed", serves[0].addr)
		}
		ps := alive()
		p := ps[rng.IntN(len(ps))]
		pid := p.cmd.Process.Pid
		switch a {
		case "kill":
			p.cmd.Process.Kill()
			mu.Lock()
			killedAt[pid] = time.Now()
			mu.Unlock()
			start(p.lang)
		case "stop":
			if _, busy := frozen[pid]; busy {
				continue
			}
			from := time.Now()
			p.cmd.Process.Signal(syscall.SIGSTOP)
			mu.Lock()
			frozen[pid] = freeze{from: from}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Past the lease (worker_timeout 4s): another worker may
				// take its tasks meanwhile.
				time.Sleep(6 * time.Second)
				mu.Lock()
				frozen[pid] = freeze{from: from, to: time.Now()}
				mu.Unlock()
				p.cmd.Process.Signal(syscall.SIGCONT)
			}()
		}
		time.Sleep(700 * time.Millisecond) // chaos spread over the run: the pace is the point
	}
	wg.Wait()

	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var ts []*task.Task
		for _, state := range []task.State{task.StatePending, task.StateRunning} {
			some, _ := st.List(t.Context(), task.ListQuery{State: state, Limit: 10})
			ts = append(ts, some...)
		}
		for _, x := range ts {
			b, _ := json.Marshal(x.Attempts)
			t.Logf("unfinished %s %s attempts %d next %s workers %s", x.Key, x.State, x.AttemptsStarted, x.NextClaimAt.Format(time.StampMilli), b)
		}
	})
	testutil.EventuallyEvery(t, 180*time.Second, 200*time.Millisecond, "every task to finish", func() bool {
		s, err := st.Stats(t.Context())
		if err != nil {
			return false
		}
		by := s.ByState()
		return by[task.StateSucceeded] == total && by[task.StateCancelled] == int64(len(cancelKeys))
	})

	recs := readRecords(t, recordPath)
	pidOf := map[string]int{}
	for _, r := range recs {
		pidOf[r.Worker] = r.PID
	}
	// Each attempt's handler ran from its start to its end or abort, or
	// until its process was killed; a frozen process's handlers count
	// until it was frozen (they are the frozen holders).
	type run struct {
		worker     string
		pid        int
		start, end time.Time
		ended      string
	}
	runs := map[string]map[int]*run{}
	ms := func(v int64) time.Time { return time.UnixMilli(v) }
	for _, r := range recs {
		if runs[r.Key] == nil {
			runs[r.Key] = map[int]*run{}
		}
		x := runs[r.Key][r.Attempt]
		if x == nil {
			x = &run{worker: r.Worker, pid: r.PID}
			runs[r.Key][r.Attempt] = x
		}
		if x.worker != r.Worker {
			t.Errorf("task %s attempt %d recorded by %s and %s: an attempt has one holder", r.Key, r.Attempt, x.worker, r.Worker)
		}
		switch r.Event {
		case "start":
			x.start = ms(r.T)
		case "end", "abort":
			if x.ended == "" {
				x.end, x.ended = ms(r.T), r.Event
			}
		}
	}
	aborted := map[string]bool{}
	for key, byAttempt := range runs {
		var ivs []run
		for attempt, x := range byAttempt {
			if x.start.IsZero() {
				t.Errorf("task %s attempt %d: %s without a start", key, attempt, x.ended)
				continue
			}
			if x.ended == "abort" {
				aborted[key] = true
			}
			end := x.end
			if k, ok := killedAt[x.pid]; ok && (end.IsZero() || end.After(k)) {
				end = k
			}
			if f, ok := frozen[x.pid]; ok && x.start.Before(f.from) && (end.IsZero() || end.After(f.from)) {
				// Running when frozen: aborted soon after it was resumed
				// (its first renew), or its handler ended then; its outcome
				// must not be recorded, the lease having ended meanwhile.
				_, killed := killedAt[x.pid]
				if (x.end.IsZero() && !killed) || (!x.end.IsZero() && x.end.After(f.to.Add(5*time.Second))) {
					t.Errorf("task %s attempt %d on frozen %s: ended %q at %s, resumed at %s: want its abort within a renew of the resume",
						key, attempt, x.worker, x.ended, x.end.Format(time.StampMilli), f.to.Format(time.StampMilli))
				}
				doc, err := st.Get(t.Context(), key)
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range doc.Attempts {
					if w.Attempt == attempt && w.State == task.AttemptSuccess {
						t.Errorf("task %s attempt %d: the outcome of frozen %s, whose lease ended while it was stopped, was recorded", key, attempt, x.worker)
					}
				}
				end = f.from
			}
			if end.IsZero() {
				t.Errorf("task %s attempt %d on %s never ended, and its process lives", key, attempt, x.worker)
				continue
			}
			ivs = append(ivs, run{worker: x.worker, start: x.start, end: end})
		}
		for i, a := range ivs {
			for _, b := range ivs[i+1:] {
				if a.start.Before(b.end) && b.start.Before(a.end) {
					t.Errorf("task %s: %s (%s–%s) and %s (%s–%s) ran at once", key,
						a.worker, a.start.Format(time.StampMilli), a.end.Format(time.StampMilli),
						b.worker, b.start.Format(time.StampMilli), b.end.Format(time.StampMilli))
				}
			}
		}
	}
	// Only holders' outcomes are recorded: each task's success is the end
	// of a recorded run of the same worker and attempt.
	for key, byAttempt := range runs {
		if strings.HasPrefix(key, "cancel-") {
			continue
		}
		doc, err := st.Get(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		succeeded := 0
		for _, w := range doc.Attempts {
			if w.State != task.AttemptSuccess {
				continue
			}
			succeeded++
			if x := byAttempt[w.Attempt]; x == nil || x.worker != w.WorkerID || x.ended != "end" {
				t.Errorf("task %s: success of %s attempt %d has no recorded end of that attempt", key, w.WorkerID, w.Attempt)
			}
		}
		if succeeded != 1 {
			t.Errorf("task %s: %d successes recorded, want 1", key, succeeded)
		}
	}
	langs := map[string]int{}
	for _, byAttempt := range runs {
		for _, x := range byAttempt {
			if x.ended == "end" {
				langs[x.worker[:2]]++
			}
		}
	}
	if langs["ts"] == 0 || langs["py"] == 0 {
		t.Errorf("ends by language %v: want both to have run tasks", langs)
	}
	t.Logf("%d tasks, %d records, runs by language %v, %d kills, %d stops, serve %s killed", total, len(recs), langs, len(killedAt), len(frozen), serves[0].addr)
}

// publishWithClients publishes n tasks of kind with the TypeScript
// client's publishMany (keys ts-000...) and n with the Python client's
// publish_many (py-000...), each with a payload of payload(), through the
// serve at url.
func publishWithClients(t *testing.T, url, kind string, n int, payload func() map[string]int) {
	t.Helper()
	tasks := func(prefix string) []byte {
		var ts []map[string]any
		for i := range n {
			ts = append(ts, map[string]any{"key": fmt.Sprintf("%s-%03d", prefix, i), "kind": kind, "payload": payload()})
		}
		b, _ := json.Marshal(ts)
		return b
	}
	ts := exec.Command("node", "-e", `
const { Client } = require(process.argv[1]);
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", async () => {
  const r = await new Client({ url: process.argv[2] }).publishMany(JSON.parse(input));
  console.log(JSON.stringify({ inserted: r.inserted }));
});`, clientDir("typescript"), url)
	ts.Stdin = strings.NewReader(string(tasks("ts")))
	py := exec.Command("python3", "-c", `
import json, sys
sys.path.insert(0, sys.argv[1])
from leasepool import Client
r = Client(sys.argv[2]).publish_many(json.load(sys.stdin))
print(json.dumps({"inserted": r["inserted"]}))
`, filepath.Join(clientDir("python"), "src"), url)
	py.Stdin = strings.NewReader(string(tasks("py")))
	for _, cmd := range []*exec.Cmd{ts, py} {
		out, err := cmd.CombinedOutput()
		var got struct{ Inserted int }
		if err != nil || json.Unmarshal(out, &got) != nil || got.Inserted != n {
			t.Fatalf("%s publish: %v: %s (want %d inserted)", cmd.Path, err, out, n)
		}
	}
}

// httpGet returns the status of a GET of url.
func httpGet(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
