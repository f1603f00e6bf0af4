package singleton_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
)

// The elector tests run on the in-memory store inside a synctest bubble:
// leases, renewals and takeovers take fake time, so they are measured to
// the millisecond and cost nothing.
const (
	electorLease = 3 * time.Second
	electorRenew = time.Second
)

// dutyNames are the duties every elector of a test registers.
var dutyNames = []string{"schedule", "retention"}

// cluster is electors on one store, each on a handle of its own (as
// processes would be), with one journal per duty across all of them.
type cluster struct {
	t        *testing.T
	db       *memstore.DB
	journals map[string]*journal
	electors map[string]*singleton.Elector
	stores   map[string]*freezable
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, db: memstore.New(memstore.Config{}), journals: map[string]*journal{},
		electors: map[string]*singleton.Elector{}, stores: map[string]*freezable{}}
	for _, d := range dutyNames {
		c.journals[d] = &journal{t: t}
	}
	return c
}

// start starts an elector named id with every duty registered.
func (c *cluster) start(id string) *singleton.Elector {
	c.t.Helper()
	st := &freezable{Store: c.db.Open()}
	e, err := singleton.NewElector(singleton.ElectorConfig{Store: st, Key: "test.elector", HolderID: id,
		Lease: electorLease, Renew: electorRenew, Logger: slog.New(slog.NewTextHandler(tlogWriter{c.t}, nil)).With(slog.String("elector", id))})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, d := range dutyNames {
		if err := e.Register(singleton.Duty{Name: d, Run: c.journals[d].work(id)}); err != nil {
			c.t.Fatal(err)
		}
	}
	if err := e.Start(context.Background()); err != nil {
		c.t.Fatal(err)
	}
	c.electors[id], c.stores[id] = e, st
	return e
}

// elected returns the ids of the electors elected now.
func (c *cluster) elected() []string {
	var ids []string
	for id, e := range c.electors {
		if e.Elected() {
			ids = append(ids, id)
		}
	}
	return ids
}

// waitElected waits until exactly one elector other than not is elected,
// with every duty running there and nowhere else, and returns its id and
// how long that took.
func (c *cluster) waitElected(within time.Duration, not string) (string, time.Duration) {
	c.t.Helper()
	var id string
	took := testutil.EventuallyTook(c.t, within, "one elector elected with its duties running", func() bool {
		ids := c.elected()
		if len(ids) != 1 || ids[0] == not {
			return false
		}
		id = ids[0]
		for other, e := range c.electors {
			for _, d := range dutyNames {
				if e.Running(d) != (other == id) {
					return false
				}
			}
		}
		return true
	})
	return id, took
}

// terms counts the runs of duty d by id recorded so far (each ended).
func (c *cluster) terms(d, id string) int {
	j := c.journals[d]
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, r := range j.runs {
		if r.who == id {
			n++
		}
	}
	return n
}

// stop stops every elector still running, then checks that no duty ever
// ran in two electors at once.
func (c *cluster) stop() {
	for _, st := range c.stores {
		st.unfreeze()
	}
	for _, e := range c.electors {
		if err := e.Stop(context.Background()); err != nil {
			c.t.Error(err)
		}
	}
	for _, j := range c.journals {
		j.check()
	}
}

// TestElectorOneAtATime: of three electors on one store, one is elected
// and runs every duty, and stays so while it renews; stopped, it gives
// the lease up and another is elected within a renewal period; killed
// (its lease left to run out), another within a lease. No duty ever runs
// in two at once, and each holder ran each duty once per election.
func TestElectorOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t)
		defer c.stop()
		for _, id := range []string{"a", "b", "c"} {
			c.start(id)
		}
		first, _ := c.waitElected(electorLease, "")

		// Ten renewals later it is still the one elected, its duties never
		// restarted: a holder that renews keeps its term.
		since := time.Now()
		testutil.Eventually(t, 20*electorLease, "ten renewal periods", func() bool {
			if ids := c.elected(); len(ids) != 1 || ids[0] != first {
				t.Fatalf("elected %v, want %s alone while it renews", ids, first)
			}
			return time.Since(since) >= 10*electorRenew
		})
		for _, d := range dutyNames {
			if n := c.terms(d, first); n != 0 {
				t.Errorf("duty %s ended %d times in %s while it renewed", d, n, first)
			}
		}

		// A graceful stop releases the lease.
		stopped := time.Now()
		if err := c.electors[first].Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if c.electors[first].Elected() {
			t.Errorf("%s elected after Stop returned", first)
		}
		for _, d := range dutyNames {
			if c.electors[first].Running(d) || c.terms(d, first) != 1 {
				t.Errorf("%s after Stop: duty %s running %v, ended %d times; want stopped once",
					first, d, c.electors[first].Running(d), c.terms(d, first))
			}
		}
		delete(c.electors, first)
		second, took := c.waitElected(electorLease, first)
		t.Logf("elected after a stop: %s in %s", second, took)
		if took := time.Since(stopped); took > electorRenew+50*time.Millisecond {
			t.Errorf("%s elected %s after %s stopped, want within a renewal period (%s)", second, took, first, electorRenew)
		}

		// A crash leaves the lease to run out: the last one is elected
		// within a lease, and not before the lease can have run out.
		killed := time.Now()
		if err := c.electors[second].Abandon(context.Background()); err != nil {
			t.Fatal(err)
		}
		delete(c.electors, second)
		third, _ := c.waitElected(2*electorLease, second)
		took = time.Since(killed)
		t.Logf("elected after a crash: %s in %s", third, took)
		if took < electorLease-electorRenew || took > electorLease+100*time.Millisecond {
			t.Errorf("%s elected %s after %s crashed, want within a lease (%s) and not before it can have run out",
				third, took, second, electorLease)
		}
	})
}

// TestElectorDutiesStopWhenLeaseLost: when the store says another holder
// took the lease, the elected process stops its duties (each one's
// context ends, and each has returned) at its next renewal, and is no
// longer elected.
func TestElectorDutiesStopWhenLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t)
		defer c.stop()
		e := c.start("a")
		c.waitElected(electorLease, "")

		// Another holder takes the lease out from under it.
		st := c.db.Open()
		defer st.Close()
		ctx := context.Background()
		key := []string{"test.elector"}
		if err := st.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: e.Holder()}); err != nil {
			t.Fatal(err)
		}
		thief := task.Holder{TaskKey: "test.elector", WorkerID: "thief"}
		now := st.Now()
		if err := st.AcquireLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: thief, Now: now, Until: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		took := testutil.EventuallyTook(t, 2*electorRenew, "a's duties to stop", func() bool {
			return !e.Elected() && !e.Running("schedule") && !e.Running("retention")
		})
		if took > electorRenew+50*time.Millisecond {
			t.Errorf("duties stopped %s after the lease was taken, want at the next renewal (%s)", took, electorRenew)
		}
		for _, d := range dutyNames {
			if n := c.terms(d, "a"); n != 1 {
				t.Errorf("duty %s returned %d times, want once", d, n)
			}
		}
		// It stands by and is elected again once the thief lets go.
		if err := st.ReleaseLocks(ctx, task.LockParams{Namespace: task.LockSingleton, Keys: key, Holder: thief}); err != nil {
			t.Fatal(err)
		}
		c.waitElected(2*electorLease, "")
	})
}

// TestElectorFrozenHolder: the elected process's renewals hang (a hung
// store, a process paused): its duties stop before its lease can have
// run out, another is elected after it, and when the stuck renewal lands
// late the first stands by.
func TestElectorFrozenHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t)
		defer c.stop()
		c.start("a")
		c.waitElected(electorLease, "")
		c.start("b")

		frozen := time.Now()
		c.stores["a"].freeze()
		c.waitElected(2*electorLease, "a")
		took := time.Since(frozen)
		for _, d := range dutyNames {
			end, ok := c.journals[d].lastEnd("a")
			if !ok {
				t.Fatalf("a's duty %s never stopped", d)
			}
			if end.Sub(frozen) > electorLease-electorLease/10 {
				t.Errorf("a's duty %s stopped %s after its renewals hung, later than its lease less a tenth", d, end.Sub(frozen))
			}
		}
		if took > electorLease+100*time.Millisecond {
			t.Errorf("b elected %s after a froze, want within a lease (%s)", took, electorLease)
		}

		c.stores["a"].unfreeze()
		since := time.Now()
		testutil.Eventually(t, 10*electorLease, "three renewal periods after a thawed", func() bool {
			if ids := c.elected(); len(ids) != 1 || ids[0] != "b" {
				t.Fatalf("elected %v after a's late renewal, want b alone", ids)
			}
			return time.Since(since) >= 3*electorRenew
		})
	})
}

// TestElectorRunsAReturnedDutyAgain: a duty that returns while elected
// (an error) is logged and run again after Retry; the other duties and
// the lease go on.
func TestElectorRunsAReturnedDutyAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{})
		st := db.Open()
		defer st.Close()
		var logs testutil.SyncBuffer
		e, err := singleton.NewElector(singleton.ElectorConfig{Store: st, Key: "k", HolderID: "a", Lease: electorLease,
			Retry: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var flaky, steady atomic.Int32
		var mu sync.Mutex
		var starts []time.Time
		fail := errors.New("broken here")
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(e.Register(singleton.Duty{Name: "flaky", Run: func(ctx context.Context) error {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			if flaky.Add(1) == 1 {
				return fail
			}
			<-ctx.Done()
			return nil
		}}))
		must(e.Register(singleton.Duty{Name: "steady", Run: func(ctx context.Context) error {
			steady.Add(1)
			<-ctx.Done()
			return nil
		}}))
		must(e.Start(context.Background()))
		testutil.Eventually(t, 2*electorLease, "flaky run again", func() bool { return flaky.Load() == 2 && e.Running("flaky") })
		if gap := starts[1].Sub(starts[0]); gap != 500*time.Millisecond {
			t.Errorf("flaky run again %s after it returned, want after Retry (500ms)", gap)
		}
		if n := steady.Load(); n != 1 || !e.Running("steady") || !e.Elected() {
			t.Errorf("steady started %d times, running %v, elected %v; want once, still running, elected", n, e.Running("steady"), e.Elected())
		}
		if !strings.Contains(logs.String(), "broken here") || !strings.Contains(logs.String(), "duty=flaky") {
			t.Errorf("log does not name the duty and its error:\n%s", logs.String())
		}
		must(e.Stop(context.Background()))
		if e.Running("flaky") || e.Running("steady") || e.Elected() {
			t.Error("duties running after Stop")
		}
	})
}

func TestElectorRegister(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.Config{}).Open()
		defer st.Close()
		if _, err := singleton.NewElector(singleton.ElectorConfig{Store: st, Key: "k", HolderID: "a", Retry: -time.Second}); !errors.Is(err, task.ErrInvalid) ||
			!strings.Contains(err.Error(), "retry:") {
			t.Errorf("negative retry: %v, want ErrInvalid naming retry", err)
		}
		if _, err := singleton.NewElector(singleton.ElectorConfig{Store: st, HolderID: "a"}); !errors.Is(err, task.ErrInvalid) ||
			!strings.Contains(err.Error(), "key:") {
			t.Errorf("no key: %v, want ErrInvalid naming key", err)
		}
		e, err := singleton.NewElector(singleton.ElectorConfig{Store: st, Key: "k", HolderID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if e.Lease() != singleton.DefaultLease {
			t.Errorf("Lease() = %s, want the default %s", e.Lease(), singleton.DefaultLease)
		}
		run := func(ctx context.Context) error { <-ctx.Done(); return nil }
		if err := e.Register(singleton.Duty{Name: "d", Run: run}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			d    singleton.Duty
			want string
		}{
			{singleton.Duty{Run: run}, "duty name: required"},
			{singleton.Duty{Name: "e"}, `duty "e": run: required`},
			{singleton.Duty{Name: "d", Run: run}, `duty "d" registered twice`},
		} {
			if err := e.Register(c.d); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Register(%q) = %v, want ErrInvalid saying %s", c.d.Name, err, c.want)
			}
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer e.Stop(context.Background())
		if err := e.Register(singleton.Duty{Name: "late", Run: run}); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "after Start") {
			t.Errorf("Register after Start = %v, want ErrInvalid saying after Start", err)
		}
		testutil.Eventually(t, time.Minute, "elected alone", func() bool { return e.Elected() && e.Running("d") })
	})
}

// TestElectorWithoutDuties: an elector with no duty stays elected while it
// renews (being elected means something of its own: Elected), rather than
// give the lease up at once.
func TestElectorWithoutDuties(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New(memstore.Config{}).Open()
		defer st.Close()
		var logs testutil.SyncBuffer
		e, err := singleton.NewElector(singleton.ElectorConfig{Store: st, Key: "k", HolderID: "a", Lease: electorLease,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, electorLease, "elected", e.Elected)
		since := time.Now()
		testutil.Eventually(t, 10*electorLease, "five renewal periods", func() bool {
			if !e.Elected() {
				t.Fatalf("no longer elected %s after the election", time.Since(since))
			}
			return time.Since(since) >= 5*electorRenew
		})
		if err := e.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if strings.Count(logs.String(), "singleton lease taken") != 1 || strings.Contains(logs.String(), "returned") {
			t.Errorf("want one election and no work returned:\n%s", logs.String())
		}
	})
}
