package web_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// FuzzPublishBody: whatever POST /api/v1/tasks is sent, the real handler
// over a SQLite store never panics and never answers 500; a body it refuses
// is a 4xx with a JSON error; a task it inserts reads back with the key,
// kind and payload sent.
func FuzzPublishBody(f *testing.F) {
	for _, seed := range []string{
		`{"key":"a","kind":"noop"}`,
		`{"key":"b","kind":"k","payload":{"x":[1,"é",{"y":null}]},"priority":3,"run_at":"2030-01-01T00:00:00Z","lock_keys":["device:1"]}`,
		`{"key":"c","kind":"k","delay":"1s","ping_interval":"1s","worker_timeout":"5s","max_unexpected_retries":0}`,
		`{"key":"leasepool:control","kind":"leasepool.control","rerun":true}`,
		`{"key":"leasepool:flow:x","kind":"leasepool.flow","payload":{"steps":7}}`,
		`{"key":"r","kind":"k","lock_keys":["rate:kind:k#0"]}`,
		`{"key":"d","kind":"k","payload":` + deepJSON(1001) + `}`,
		`{"key":"d","kind":"k","payload":` + deepJSON(64) + `}`,
		"{\"key\":\"a\xffb\",\"kind\":\"k\"}",
		"{\"key\":\"u\",\"kind\":\"k\",\"payload\":\"\xed\xa0\x80\"}",
		`{"key":"t","kind":"k","run_at":"9999-01-01T00:00:00Z"}`,
		`{"key":"t","kind":"k","delay":"2562047h"}`,
		`{"key":"e","kind":"exec","payload":{"argv":["/bin/sh","-c","id"]}}`,
		`{"key":"m","kind":"device","payload":{"device":"pump-7","command":"start"}}`,
		`{"key":"n","kind":"k","payload":null}`, `{"key":"q","kind":"k","KEY":"Q"}`,
		`{}`, `[]`, `null`, ``, `{"key":"a","kind":"k"} {}`, `{"key":"a","kind":"k","x":1}`,
	} {
		f.Add([]byte(seed))
	}
	s, err := store.Open(f.Context(), "sqlite:"+filepath.Join(f.TempDir(), "s.db"), store.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	h, err := web.NewHandler(web.Config{Store: s})
	if err != nil {
		f.Fatal(err)
	}
	serve := func(method, path string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Host = "127.0.0.1"
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rec := serve("POST", "/api/v1/tasks", b)
		switch code := rec.Code; {
		case code >= 500:
			t.Fatalf("POST %q = %d %s", b, code, rec.Body)
		case code >= 400:
			var e struct{ Error string }
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" || strings.ContainsRune(e.Error, '\n') {
				t.Fatalf("POST %q = %d with %q; want a one-line JSON error", b, code, rec.Body)
			}
			return
		case code != http.StatusCreated:
			return // an existing task, left alone or rerun
		}
		var sent struct {
			Key     string          `json:"key"`
			Kind    string          `json:"kind"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(b, &sent); err != nil {
			t.Fatalf("POST %q accepted, but it does not decode: %v", b, err)
		}
		if task.Reserved(sent.Key) {
			t.Fatalf("POST %q stored a reserved key", b)
		}
		got := serve("GET", "/api/v1/tasks/"+url.PathEscape(sent.Key), nil)
		var tk task.Task
		if got.Code != http.StatusOK || json.Unmarshal(got.Body.Bytes(), &tk) != nil {
			t.Fatalf("GET %s after POST %q = %d %s", sent.Key, b, got.Code, got.Body)
		}
		if tk.Key != sent.Key || tk.Kind != sent.Kind {
			t.Fatalf("POST %q read back as key %q kind %q", b, tk.Key, tk.Kind)
		}
		if sent.Kind != mqttdev.Kind && !sameJSON(t, sent.Payload, tk.Payload) {
			t.Fatalf("POST %q read back with payload %s", b, tk.Payload)
		}
	})
}

// sameJSON reports whether a and b are the same JSON value, an absent
// payload reading back as {}.
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	norm := func(m json.RawMessage) string {
		if len(m) == 0 {
			return "{}"
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, m); err != nil {
			t.Fatalf("compact %q: %v", m, err)
		}
		return buf.String()
	}
	return norm(a) == norm(b)
}
