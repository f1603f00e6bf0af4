package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/web"
)

// The rollout pages over plain HTTP: the list and a rollout's page with
// its waves drawn, hostile names kept text; pause and resume only with the
// form token, never cross-site, never read-only; a pause of a paused
// rollout said on the page; unknown and missing names.
func TestDashboardRollouts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	waves, err := rollout.ParseWaves("1,50%,100%")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := rollout.ParseAbortRules("failed>10% after 4")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rollout.Create(t.Context(), e.store, "fw-1", rollout.Spec{Command: `flash<script>`,
		Devices: []string{"d1", "d2", "d3", "d4"}, Waves: waves, AbortWhen: rules}); err != nil {
		t.Fatal(err)
	}
	e.wantPage("/rollouts", 200, `href="/rollout?name=fw-1"`, "flash&lt;script&gt;", "1 of 3")
	e.wantPage("/rollout?name=fw-1", 200, `id="rollout-waves"`, `data-abort-at="10"`, `data-wave="3"`, `id="rollout-pause"`,
		"flash&lt;script&gt;")
	e.wantPage("/rollout?name=nope", 404)
	e.wantPage("/rollout", 400, "name: must not be empty")

	tok := e.csrf()
	state := func() rollout.State {
		t.Helper()
		r, err := rollout.Get(t.Context(), e.store, "fw-1")
		if err != nil {
			t.Fatal(err)
		}
		return r.State
	}
	for name, c := range map[string]struct {
		form url.Values
		edit func(*http.Request)
	}{
		"no token":   {url.Values{"name": {"fw-1"}}, nil},
		"cross-site": {url.Values{"name": {"fw-1"}, "csrf": {tok}}, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }},
	} {
		if code, _ := e.send("POST", "/rollout/pause", c.form, c.edit); code != 403 {
			t.Errorf("%s: pause answered %d, want 403", name, code)
		}
	}
	if got := state(); got != rollout.StateRunning {
		t.Fatalf("after refused pauses: %s, want running", got)
	}
	if code, loc := e.send("POST", "/rollout/pause", url.Values{"name": {"fw-1"}, "csrf": {tok}}, nil); code != 303 || loc != "/rollout?name=fw-1&msg=rollout-paused" {
		t.Errorf("pause: %d %s", code, loc)
	}
	if got := state(); got != rollout.StatePaused {
		t.Errorf("after the pause: %s", got)
	}
	e.wantPage("/rollout?name=fw-1&msg=rollout-paused", 200, "rollout paused", `id="rollout-resume"`)
	if code, loc := e.send("POST", "/rollout/pause", url.Values{"name": {"fw-1"}, "csrf": {tok}}, nil); code != 303 || loc != "/rollout?name=fw-1&msg=rollout-already-paused" {
		t.Errorf("a second pause: %d %s", code, loc)
	}
	if code, loc := e.send("POST", "/rollout/resume", url.Values{"name": {"fw-1"}, "csrf": {tok}}, nil); code != 303 || loc != "/rollout?name=fw-1&msg=rollout-resumed" {
		t.Errorf("resume: %d %s", code, loc)
	}
	if got := state(); got != rollout.StateRunning {
		t.Errorf("after the resume: %s", got)
	}
	if code, loc := e.send("POST", "/rollout/resume", url.Values{"name": {"fw-1"}, "csrf": {tok}}, nil); code != 303 || loc != "/rollout?name=fw-1&msg=rollout-not-paused" {
		t.Errorf("a resume of a running rollout: %d %s", code, loc)
	}
	// Approving ahead: the next wave will not wait at its gate.
	if code, loc := e.send("POST", "/rollout/approve", url.Values{"name": {"fw-1"}, "csrf": {tok}}, nil); code != 303 || loc != "/rollout?name=fw-1&msg=rollout-approved" {
		t.Errorf("approve: %d %s", code, loc)
	}
	if r, err := rollout.Get(t.Context(), e.store, "fw-1"); err != nil || !r.Waves[1].Approved {
		t.Errorf("after the approve: wave 2 approved %v (%v)", r.Waves[1].Approved, err)
	}
	if code, _ := e.send("POST", "/rollout/pause", url.Values{"name": {"nope"}, "csrf": {tok}}, nil); code != 404 {
		t.Errorf("pause of an unknown rollout: %d, want 404", code)
	}
	if code, body := e.send("POST", "/rollout/pause", url.Values{"csrf": {tok}}, nil); code != 400 || !strings.Contains(body, "name: ") {
		t.Errorf("pause without a name: %d", code)
	}

	ro := newEnv(t, web.Config{ReadOnly: true})
	if _, err := rollout.Create(t.Context(), ro.store, "fw-1", rollout.Spec{Command: "flash", Devices: []string{"d1"}}); err != nil {
		t.Fatal(err)
	}
	body := ro.wantPage("/rollout?name=fw-1", 200, `id="rollout-waves"`)
	if strings.Contains(body, `id="rollout-pause"`) {
		t.Error("a read-only server shows the pause button")
	}
	if code, _ := ro.send("POST", "/rollout/pause", url.Values{"name": {"fw-1"}}, nil); code != 403 {
		t.Errorf("read-only pause: %d, want 403", code)
	}
}

// The overview's charts: the range named, a bad one refused naming the
// field.
func TestDashboardChartRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	e.wantPage("/", 200, `id="chart-all"`, `data-step="1m0s"`, "last hour, per minute", `id="charts-empty"`)
	e.wantPage("/?range=day", 200, `data-step="15m0s"`, "last day, per 15 minutes")
	e.wantPage("/?range=week", 400, "range: must be hour or day")
}
