package web_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/leasepool/leasepool/web"
)

// TestLabelsBodyKeyGivenTwice: a labels body holding a key twice is a 400
// naming the key, not the last value kept.
func TestLabelsBodyKeyGivenTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for _, tc := range []struct{ method, body, want string }{
		{"PUT", `{"labels":{"ring":"a","ring":"canary"}}`, `labels: key "ring" is given twice`},
		{"PUT", `{"labels":{"ring":"a","r\u0069ng":"canary"}}`, `labels: key "ring" is given twice`},
		{"PUT", `{"labels":{"ring":"a"},"labels":{"ring":"canary"}}`, `body: key "labels" is given twice`},
		{"PUT", `{"labels":{"ring":"a"},"Labels":{"ring":"canary"}}`, `body: key "Labels" is given twice`},
		{"PATCH", `{"set":{"ring":"a","ring":"canary"}}`, `set: key "ring" is given twice`},
		{"PATCH", `{"set":{"ring":"a"},"remove":["x"],"set":{"ring":"canary"}}`, `body: key "set" is given twice`},
	} {
		code, out := e.do(tc.method, "/api/v1/devices/d1/labels", tc.body)
		var res struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || code != http.StatusBadRequest || res.Error != tc.want {
			t.Errorf("%s %s = %d %s, want 400 saying %s", tc.method, tc.body, code, out, tc.want)
		}
	}
	assertNothingWritten(t, e)
	// Different keys, the same key in two objects: fine.
	if code, out := e.do("PUT", "/api/v1/devices/d1/labels", `{"labels":{"ring":"a","Ring":"b"}}`); code != 200 {
		t.Fatalf("PUT = %d %s", code, out)
	}
}
