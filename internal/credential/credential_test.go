package credential

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openStore(t *testing.T) task.Store {
	t.Helper()
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestStoredAsHashOnly: the store holds the secret's hash, never the
// secret; the hash matches the secret and nothing else.
func TestStoredAsHashOnly(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := openStore(t)
	secret, err := Add(ctx, st, "dev-1", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(secret) != 43 {
		t.Errorf("secret %q is %d characters, want 43 (32 bytes base64url)", secret, len(secret))
	}
	d, err := st.GetDocument(ctx, Namespace, "dev-1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(d.Value), secret) {
		t.Fatalf("the stored document holds the secret: %s", d.Value)
	}
	c, err := Get(ctx, st, "dev-1")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Matches(secret) || c.Matches(secret+"x") || c.Matches("") {
		t.Error("Matches: want the secret alone to match")
	}
	if _, err := Add(ctx, st, "dev-1", false); !errors.Is(err, ErrExists) {
		t.Errorf("Add of an existing id = %v, want ErrExists", err)
	}
	replaced, err := Add(ctx, st, "dev-1", true)
	if err != nil || replaced == secret {
		t.Fatalf("Add with replace = %q, %v: want a new secret", replaced, err)
	}
	list, err := List(ctx, st)
	if err != nil || len(list) != 1 || !list[0].Matches(replaced) || list[0].Matches(secret) {
		t.Fatalf("List = %+v, %v: want dev-1 with the replacing secret only", list, err)
	}
	if err := Revoke(ctx, st, "dev-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := Get(ctx, st, "dev-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Revoke = %v, want ErrNotFound", err)
	}
	for _, id := range []string{"", "a/b", "a+", "#", WorkerUser("w1"), "leasepool-worker-w1", "leasepool-sim-dev-1"} {
		if _, err := Add(ctx, st, id, false); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("Add(%q) = %v, want ErrInvalid", id, err)
		}
	}
}

// TestAddSimulatedReplacesOnlySimulated: a simulator's credential
// replaces its own kind, never one an operator made.
func TestAddSimulatedReplacesOnlySimulated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := openStore(t)
	first, err := AddSimulated(ctx, st, "sim-0")
	if err != nil {
		t.Fatal(err)
	}
	second, err := AddSimulated(ctx, st, "sim-0")
	if c, gerr := Get(ctx, st, "sim-0"); err != nil || gerr != nil || !c.Matches(second) || c.Matches(first) || !c.Simulated {
		t.Fatalf("second AddSimulated = %v, %v: want the simulated credential replaced", err, gerr)
	}
	real, err := Add(ctx, st, "pump-0", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AddSimulated(ctx, st, "pump-0"); !errors.Is(err, ErrNotSimulated) {
		t.Fatalf("AddSimulated over an operator's credential = %v, want ErrNotSimulated", err)
	}
	if c, err := Get(ctx, st, "pump-0"); err != nil || !c.Matches(real) {
		t.Fatalf("the operator's credential changed: %v", err)
	}
}

// TestAddSimulatedMany: a fleet's credentials in one call, each secret
// matching its stored hash, replacing the simulated ones made before, and
// none written when one id holds an operator's credential.
func TestAddSimulatedMany(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := openStore(t)
	const n = 2000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "sim-" + strconv.Itoa(i)
	}
	old, err := AddSimulated(ctx, st, "sim-7")
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	secrets, err := AddSimulatedMany(ctx, st, append(ids, "sim-7")) // an id twice is made once
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d credentials in %s", n, time.Since(begin).Round(time.Millisecond))
	list, err := List(ctx, st)
	if err != nil || len(list) != n || len(secrets) != n {
		t.Fatalf("List: %d credentials, %v; %d secrets returned: want %d", len(list), err, len(secrets), n)
	}
	for _, c := range list {
		if !c.Matches(secrets[c.ID]) || !c.Simulated || (c.ID == "sim-7" && c.Matches(old)) {
			t.Fatalf("%s: stored credential does not match the secret returned (or is not simulated)", c.ID)
		}
	}
	if _, err := Add(ctx, st, "pump-0", false); err != nil {
		t.Fatal(err)
	}
	if _, err := AddSimulatedMany(ctx, st, []string{"sim-new", "pump-0"}); !errors.Is(err, ErrNotSimulated) {
		t.Fatalf("AddSimulatedMany over an operator's credential = %v, want ErrNotSimulated", err)
	}
	if _, err := Get(ctx, st, "sim-new"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("sim-new written though the batch was refused: %v", err)
	}
	if _, err := AddSimulatedMany(ctx, st, []string{"worker:x"}); err == nil || !strings.Contains(err.Error(), "worker:x") {
		t.Fatalf("AddSimulatedMany of a worker's user name = %v, want an error naming it", err)
	}
}

// TestWorkerSecretMadeOnce: processes asking at once for the worker
// secret of one store all get the same one.
func TestWorkerSecretMadeOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s.db")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		secrets = map[string]int{}
	)
	for range 8 {
		st, err := sqlitestore.Open(t.Context(), path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		wg.Go(func() {
			s, err := WorkerSecret(t.Context(), st)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			secrets[s]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(secrets) != 1 {
		t.Fatalf("%d different worker secrets made, want 1", len(secrets))
	}
	st := openStore(t)
	if _, found, err := WorkerHash(t.Context(), st); found || err != nil {
		t.Fatalf("WorkerHash of a fresh store: found %v, %v; want none", found, err)
	}
}
