package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// sseMsg is one SSE block: its id, event name, data, or a comment.
type sseMsg struct {
	id, event, data, comment string
}

// sseClient reads one event stream.
type sseClient struct {
	t      *testing.T
	msgs   chan sseMsg
	cancel context.CancelFunc
	done   chan struct{}
}

// openSSE GETs path with the env's token (and Last-Event-ID when set) and
// returns the stream; it fails the test on a status other than 200.
func (e *env) openSSE(path, lastID string) *sseClient {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.t.Context())
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		e.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	c := &sseClient{t: e.t, msgs: make(chan sseMsg, 100), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var m sseMsg
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				select {
				case c.msgs <- m:
				case <-ctx.Done():
					return
				}
				m = sseMsg{}
			case strings.HasPrefix(line, ":"):
				m.comment = strings.TrimSpace(line[1:])
			default:
				k, v, _ := strings.Cut(line, ": ")
				switch k {
				case "id":
					m.id = v
				case "event":
					m.event = v
				case "data":
					m.data = v
				}
			}
		}
	}()
	e.t.Cleanup(c.close)
	return c
}

func (c *sseClient) close() {
	c.cancel()
	<-c.done
}

// event is the next message carrying data, skipping heartbeats.
func (c *sseClient) event() (id string, ev struct{ Event, Key, Token string }) {
	c.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-c.msgs:
			if m.data == "" {
				continue
			}
			if m.event != "" {
				c.t.Fatalf("event %q: %s", m.event, m.data)
			}
			if err := json.Unmarshal([]byte(m.data), &ev); err != nil {
				c.t.Fatal(err)
			}
			if ev.Token != m.id {
				c.t.Fatalf("id %q differs from the event's token %q", m.id, ev.Token)
			}
			return m.id, ev
		case <-timeout:
			c.t.Fatal("no event within 30s")
		}
	}
}

// events reads n events as "type key".
func (c *sseClient) events(n int) (ids, got []string) {
	c.t.Helper()
	for range n {
		id, ev := c.event()
		ids = append(ids, id)
		got = append(got, ev.Event+" "+ev.Key)
	}
	return ids, got
}

func (e *env) pub(key, kind string) {
	e.t.Helper()
	if _, _, err := task.Publish(e.t.Context(), e.store, task.PublishParams{Key: key, Kind: kind}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) cancelTask(key string) {
	e.t.Helper()
	if _, err := task.Cancel(e.t.Context(), e.store, key); err != nil {
		e.t.Fatal(err)
	}
}

// TestEventsResume follows the events of one kind, drops the connection
// after the second event, and resumes with Last-Event-ID (then ?since=):
// every later event arrives exactly once, in order.
func TestEventsResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token, Heartbeat: 20 * time.Millisecond})
	c := e.openSSE("/api/v1/events?kind=k1", "")
	if m := <-c.msgs; m.id == "" || m.data != "" {
		t.Fatalf("first message %+v, want the position alone", m)
	}
	e.pub("a", "k1")
	e.pub("x", "k2") // another kind: filtered out
	e.pub("b", "k1")
	e.pub("c", "k1")
	e.cancelTask("a")
	ids, got := c.events(4)
	if want := []string{"published a", "published b", "published c", "cancelled a"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	c.close()
	e.pub("d", "k1")
	e.cancelTask("b")
	e.pub("y", "k2")
	e.pub("marker", "k1")
	want := []string{"published c", "cancelled a", "published d", "cancelled b", "published marker"}
	r := e.openSSE("/api/v1/events?kind=k1", ids[1])
	if _, got := r.events(5); !slices.Equal(got, want) {
		t.Fatalf("resumed after %q: %v, want %v", ids[1], got, want)
	}
	// Nothing comes twice: the next event is the next write.
	e.pub("after", "k1")
	if _, ev := r.event(); ev.Key != "after" {
		t.Fatalf("after the resumed events: %s %s, want published after", ev.Event, ev.Key)
	}
	s := e.openSSE("/api/v1/events?kind=k1&since="+ids[3], "")
	want = append(want[2:], "published after")
	if _, got := s.events(4); !slices.Equal(got, want) {
		t.Fatalf("since %q: %v, want %v", ids[3], got, want)
	}
}

// TestEventsHeartbeatAndHangUp sees heartbeats on an idle stream, and the
// handler end when the client goes (the server's Close waits for it).
func TestEventsHeartbeatAndHangUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token, Heartbeat: 10 * time.Millisecond})
	c := e.openSSE("/api/v1/events?key=k", "")
	for beats := 0; beats < 2; {
		select {
		case m := <-c.msgs:
			if m.comment == "heartbeat" {
				beats++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no heartbeat within 30s")
		}
	}
	c.close()
	closed := make(chan struct{})
	go func() { e.srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the event stream handler did not end after the client went")
	}
}

// TestEventsStop ends open streams when Config.Stop closes (serve closes
// it on shutdown).
func TestEventsStop(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	e := newEnv(t, web.Config{Token: token, Stop: stop})
	c := e.openSSE("/api/v1/events", "")
	<-c.msgs // the position: the stream is open
	close(stop)
	select {
	case <-c.done: // the server ended the response
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after Stop closed")
	}
}

func TestEventsBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("GET", "/api/v1/events?since=!!!", "", 400, `{"error":"since: `)
	e.want("GET", "/api/v1/events?type=exploded", "", 400, `{"error":"type: \"exploded\" is not one of`)
	e.want("GET", "/api/v1/events?kinds=k1", "", 400, `{"error":"kinds: unknown parameter`)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", e.srv.URL+"/api/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Last-Event-ID", "a.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("bad Last-Event-ID: %d, want 400", resp.StatusCode)
	}
}
