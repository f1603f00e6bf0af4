package web_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/web"
)

// TestDeviceCredentialAPI: a full login makes, replaces and revokes a
// device's credential, getting the secret once; a read-only login, a
// read-only server and no login change nothing.
func TestDeviceCredentialAPI(t *testing.T) {
	t.Parallel()
	const readToken = "read-only-token"
	e := newEnv(t, web.Config{Token: token, ReadToken: readToken})
	matches := func(id, secret string) bool {
		t.Helper()
		c, err := credential.Get(t.Context(), e.store, id)
		return err == nil && c.Matches(secret)
	}
	made := func(code int, out string) string {
		t.Helper()
		var a struct{ ID, Username, Secret string }
		if err := json.Unmarshal([]byte(out), &a); err != nil || code != 201 || a.ID != "pump-1" || a.Username != "pump-1" || len(a.Secret) != 43 {
			t.Fatalf("POST credential: %d %s, want 201 with pump-1's new secret", code, out)
		}
		return a.Secret
	}

	for _, c := range []struct{ method, auth string }{
		{"POST", "Bearer " + readToken}, {"DELETE", "Bearer " + readToken}, {"POST", ""}, {"POST", "Bearer wrong"},
	} {
		if code, out := e.doAuth(c.method, "/api/v1/devices/pump-1/credential", "", c.auth); code != 403 && code != 401 {
			t.Errorf("%s with %q: %d %s, want 401 or 403", c.method, c.auth, code, out)
		}
	}
	if list, err := credential.List(t.Context(), e.store); err != nil || len(list) != 0 {
		t.Fatalf("refused requests left credentials: %+v %v", list, err)
	}

	first := made(e.do("POST", "/api/v1/devices/pump-1/credential", ""))
	if !matches("pump-1", first) {
		t.Fatal("the answered secret does not match the stored credential")
	}
	if code, out := e.do("POST", "/api/v1/devices/pump-1/credential", ""); code != 409 || !strings.Contains(out, "rotate") {
		t.Errorf("second POST: %d %s, want 409 pointing at rotate", code, out)
	}
	second := made(e.do("POST", "/api/v1/devices/pump-1/credential", `{"rotate":true}`))
	if !matches("pump-1", second) || matches("pump-1", first) {
		t.Error("rotate: want the new secret alone to match")
	}
	if code, out := e.do("POST", "/api/v1/devices/pump-1/credential", `{"rotat":true}`); code != 400 || !strings.Contains(out, "rotat") {
		t.Errorf("unknown field: %d %s, want 400 naming it", code, out)
	}
	if code, out := e.do("POST", "/api/v1/devices/worker:x/credential", ""); code != 400 || !strings.Contains(out, "device") {
		t.Errorf("a worker's name as device id: %d %s, want 400 naming the device", code, out)
	}
	if code, out := e.doAuth("DELETE", "/api/v1/devices/pump-1/credential", "", "Bearer "+readToken); code != 403 || !matches("pump-1", second) {
		t.Errorf("read-only DELETE: %d %s, want 403 and the credential kept", code, out)
	}
	if code, out := e.do("DELETE", "/api/v1/devices/pump-1/credential", ""); code != 200 || matches("pump-1", second) {
		t.Errorf("DELETE: %d %s, want 200 and the credential gone", code, out)
	}
	if code, out := e.do("DELETE", "/api/v1/devices/pump-1/credential", ""); code != 404 {
		t.Errorf("second DELETE: %d %s, want 404", code, out)
	}

	ro := newEnv(t, web.Config{Token: token, ReadOnly: true})
	if code, out := ro.do("POST", "/api/v1/devices/pump-1/credential", ""); code != 403 {
		t.Errorf("POST on a read-only server: %d %s, want 403", code, out)
	}
}
