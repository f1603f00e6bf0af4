package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestDeviceAddRotateRevoke: `device add` prints a secret that matches the
// stored hash, refuses an existing id unless --rotate, `rotate` replaces
// it, `revoke` deletes it, `credentials` lists ids and never secrets.
func TestDeviceAddRotateRevoke(t *testing.T) {
	t.Parallel()
	c := setup(t)
	secret := strings.TrimSpace(c.must("device", "add", "pump-1"))
	if len(secret) != 43 {
		t.Fatalf("device add printed %q, want the 43-character secret alone", secret)
	}
	matches := func(id, secret string) bool {
		t.Helper()
		s, err := sqlitestore.Open(context.Background(), c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		cr, err := credential.Get(context.Background(), s, id)
		return err == nil && cr.Matches(secret)
	}
	if !matches("pump-1", secret) {
		t.Fatal("the printed secret does not match the stored credential")
	}
	if _, err := c.run("device", "add", "pump-1"); err == nil || !strings.Contains(err.Error(), "device rotate pump-1") {
		t.Fatalf("second add = %v, want a refusal pointing at device rotate", err)
	}
	if !matches("pump-1", secret) {
		t.Fatal("a refused add changed the credential")
	}
	var js map[string]string
	if err := json.Unmarshal([]byte(c.must("device", "add", "pump-1", "--rotate", "--json")), &js); err != nil {
		t.Fatal(err)
	}
	if js["id"] != "pump-1" || js["username"] != "pump-1" || !matches("pump-1", js["secret"]) || matches("pump-1", secret) {
		t.Fatalf("add --rotate --json = %v: want the new secret, the old one void", js)
	}
	rotated := strings.TrimSpace(c.must("device", "rotate", "pump-1"))
	if !matches("pump-1", rotated) || matches("pump-1", js["secret"]) {
		t.Fatal("rotate: want the new secret only")
	}
	list := c.must("device", "credentials")
	if !strings.Contains(list, "pump-1") || strings.Contains(list, rotated) {
		t.Fatalf("credentials listed %q: want pump-1, never its secret", list)
	}
	c.must("device", "revoke", "pump-1")
	if matches("pump-1", rotated) {
		t.Fatal("the revoked credential still matches")
	}
	// A simulator with --store replaces no credential but a simulated
	// device's: its ids may be real devices'.
	real := strings.TrimSpace(c.must("device", "add", "sim-0"))
	if _, err := c.run("device", "simulate", "--mqtt", "tcp://127.0.0.1:1", "--id-prefix", "sim-", "--duration", "1s"); err == nil ||
		!strings.Contains(err.Error(), "--id-prefix") || !matches("sim-0", real) {
		t.Fatalf("simulate over a real device's id = %v; want refused naming --id-prefix, the credential kept", err)
	}
	for _, args := range [][]string{
		{"device", "revoke", "pump-1"},       // none left
		{"device", "rotate", "pump-2"},       // none to rotate
		{"device", "add"},                    // no id
		{"device", "add", "a/b"},             // not one topic level
		{"device", "add", "worker:w1"},       // names a worker
		{"device", "add", "x", "y"},          // two ids
		{"device", "revoke", "pump-1", "-x"}, // unknown flag
	} {
		if _, err := c.run(args...); err == nil {
			t.Errorf("leasepool %v: no error", args)
		}
	}
}

// TestSimulatorSecretsFile: --credentials reads ID:SECRET lines and names
// the line or device at fault.
func TestSimulatorSecretsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(body string) string {
		f, err := os.CreateTemp(dir, "creds")
		if err == nil {
			_, err = f.WriteString(body)
			f.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		return f.Name()
	}
	got, err := readSecretsFile(write("# fleet\ndev-0:s0\n\ndev-1:s1\n"), []string{"dev-0", "dev-1"})
	if err != nil || got["dev-0"] != "s0" || got["dev-1"] != "s1" {
		t.Fatalf("readSecretsFile = %v, %v", got, err)
	}
	for body, want := range map[string]string{
		"dev-0:s0\n":           "no line for device dev-1",
		"dev-0\ndev-1:s1\n":    "line 1",
		"a/b:s\ndev-1:s1\n":    "line 1",
		"dev-0:s0\ndev-1:\n":   "line 2",
		"dev-0:s0\n:dev-1s1\n": "line 2",
	} {
		if _, err := readSecretsFile(write(body), []string{"dev-0", "dev-1"}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("file %q: %v, want an error naming %q", body, err, want)
		}
	}
}
