package consumer_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestIdleTakeover: the worker holding a task is killed (SIGKILL: no
// release, no outcome; its lease is 1 s); an idle worker takes the task
// over within a lease, whether it heard the claim (it was busy then) or
// started after it.
func TestIdleTakeover(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env, st task.Store, another func() task.Store, spec string) {
		testTakeover(t, e, st, another, spec, true)
	})
	t.Run("sqlite-started-after-claim", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		testTakeover(t, e, e.store, func() task.Store { return e.open() }, "sqlite:"+e.path, false)
	})
}

func testTakeover(t *testing.T, e *env, st task.Store, another func() task.Store, spec string, heard bool) {
	starts := &idleStarts{}
	release := make(chan struct{})
	handler := starts.handler(func(ctx context.Context, job *consumer.Job) error {
		if job.Task.Key == "blocker" {
			return hold(ctx, t, release)
		}
		return nil
	})
	if heard {
		// B is busy while the doomed worker claims: it hears the claim,
		// and is idle after.
		e.worker("B", handler, onStore(another()), concurrency(1), idleCfg)
		publishTo(t, st, "blocker", pinned("B"))
		starts.await(t, "blocker", 1, time.Now().Add(waitLong))
	}
	kill := startDoomed(t, spec)
	publishTo(t, st, "orphan", lease(200*time.Millisecond, time.Second))
	testutil.Eventually(t, waitLong, "the doomed worker to claim orphan", func() bool {
		doc := getFrom(t, st, "orphan")
		return doc.State == task.StateRunning && doc.Attempts[0].WorkerID == "doomed"
	})
	if heard {
		close(release)
	} else {
		e.worker("B", handler, onStore(another()), idleCfg)
		warm(t, st, starts, "B")
	}
	awaitRenewals(t, st, "orphan", 2) // quiet: B hears none
	killed := kill()
	r := starts.await(t, "orphan", 1, killed.Add(time.Second+idleSlack))
	t.Logf("orphan taken over by %s %s after the kill", r.worker, r.at.Sub(killed).Round(time.Millisecond))
	if r.worker != "B" {
		t.Fatalf("orphan taken over by %s, want B", r.worker)
	}
}

const idleChildEnv = "LEASEPOOL_TEST_IDLE_CHILD"

// TestIdleChildWorker is the worker process that startDoomed runs and
// kills: it claims tasks and holds them until killed. Run as a test of its
// own (no store named in the environment) it has nothing to do.
func TestIdleChildWorker(t *testing.T) {
	spec := os.Getenv(idleChildEnv)
	if spec == "" {
		return
	}
	ctx := context.Background()
	var st task.Store
	var err error
	switch backend, where, _ := strings.Cut(spec, ":"); backend {
	case "sqlite":
		st, err = sqlitestore.Open(ctx, where, nil)
	case "mongo":
		st, err = mongostore.Open(ctx, where, nil)
	default:
		err = fmt.Errorf("%s: unknown backend in %q", idleChildEnv, spec)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{Store: st, WorkerID: "doomed", SafetyNetInterval: idleNet, Kinds: []string{testKind},
		Handler: consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
			<-ctx.Done()
			return context.Cause(ctx)
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Hour) // the process's work is to hold its claims until killed
}

// startDoomed runs worker "doomed" in a process of its own on the store
// spec names; kill kills it with SIGKILL, once, and returns when.
func startDoomed(t *testing.T, spec string) (kill func() time.Time) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleChildWorker$", "-test.count=1")
	cmd.Env = append(os.Environ(), idleChildEnv+"="+spec)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the doomed worker: %v", err)
	}
	var once sync.Once
	var at time.Time
	kill = func() time.Time {
		once.Do(func() {
			at = time.Now()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return at
	}
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("doomed worker's output:\n%s", out.String())
		}
	})
	return kill
}
