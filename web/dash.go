package web

// The dashboard: server-rendered pages (html/template, embedded templates
// and assets, no build step) over the same task.Store as the API. Pages
// read the store directly; a little plain JavaScript (static/app.js)
// re-renders the parts marked data-live when the event stream
// (/api/v1/events) reports a change, and polls when it cannot connect.
// Every POST carries a per-server CSRF token, besides the cross-origin
// guard in front of the whole handler.

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/safetext"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

//go:embed templates static
var assets embed.FS

// pageNames are the pages, each templates/NAME.html inside layout.html.
var pageNames = []string{"overview", "tasks", "task", "flows", "flow", "workers", "devices", "rollouts", "rollout", "controls", "error"}

// dashboard serves the pages and their actions.
type dashboard struct {
	store    task.Store
	log      *slog.Logger
	readOnly bool
	csrf     string
	pages    map[string]*template.Template
}

func newDashboard(cfg Config) (*dashboard, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("web: csrf secret: %w", err)
	}
	d := &dashboard{store: cfg.Store, log: cfg.Logger, readOnly: cfg.ReadOnly, csrf: hex.EncodeToString(secret),
		pages: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		d.pages[name] = t
	}
	return d, nil
}

func (d *dashboard) routes(mux *http.ServeMux) {
	static, _ := fs.Sub(assets, "static") // the directory is embedded: cannot fail
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", d.overview)
	mux.HandleFunc("GET /tasks", d.tasks)
	mux.HandleFunc("GET /task", d.task)
	mux.HandleFunc("GET /flows", d.flows)
	mux.HandleFunc("GET /flow", d.flow)
	mux.HandleFunc("POST /flow/cancel", d.action(d.cancelFlow))
	mux.HandleFunc("POST /flow/retry", d.action(d.retryFlow))
	mux.HandleFunc("POST /flow/signal", d.action(d.signalFlow))
	mux.HandleFunc("GET /workers", d.workers)
	mux.HandleFunc("GET /devices", d.devices)
	mux.HandleFunc("POST /device/approve", d.action(d.approveDevice))
	mux.HandleFunc("GET /rollouts", d.rollouts)
	mux.HandleFunc("GET /rollout", d.rollout)
	mux.HandleFunc("POST /rollout/pause", d.action(d.rolloutAction("pause")))
	mux.HandleFunc("POST /rollout/resume", d.action(d.rolloutAction("resume")))
	mux.HandleFunc("POST /rollout/approve", d.action(d.rolloutAction("approve")))
	mux.HandleFunc("GET /controls", d.controls)
	mux.HandleFunc("POST /task/cancel", d.action(d.cancelTask))
	mux.HandleFunc("POST /task/retry", d.action(d.retryTask))
	mux.HandleFunc("POST /tasks/bulk", d.action(d.bulk))
	mux.HandleFunc("POST /controls/pause", d.action(d.pause))
	mux.HandleFunc("POST /controls/resume", d.action(d.resume))
	mux.HandleFunc("POST /controls/schedule", d.action(d.schedule))
}

// page is what every template gets: the page's own data and the layout's.
type page struct {
	Title    string
	Nav      string
	CSRF     string
	ReadOnly bool
	Flash    string
	Now      time.Time
	// EventTypes are the event stream's event names, which app.js listens
	// for.
	EventTypes string
	Data       any
}

// render writes page name with data, or a 500 page when it fails (the
// template is executed into a buffer first, so no half page goes out).
func (d *dashboard) render(w http.ResponseWriter, r *http.Request, code int, name, title string, data any) {
	p := page{Title: title, Nav: name, CSRF: d.csrf, ReadOnly: d.readOnly || readOnlyRequest(r), Flash: flashText(r.URL.Query().Get("msg")),
		Now: d.store.Now(), EventTypes: strings.Join(events.Types, " "), Data: data}
	if readOnlyRequest(r) {
		p.CSRF = "" // a login that cannot write gets no form token
	}
	var buf bytes.Buffer
	if err := d.pages[name].Execute(&buf, p); err != nil {
		d.log.Error("web: render", "page", name, "err", err)
		http.Error(w, "internal error (see the server log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// Pages show live state: never serve one from cache.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes()) // the client went away: nothing to do
}

// fail renders the error page: the message for bad input and unknown
// tasks, a generic one (the error logged) for anything else.
func (d *dashboard) fail(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := http.StatusInternalServerError, "internal error (see the server log)"
	switch {
	case errors.Is(err, task.ErrInvalid):
		code, msg = http.StatusBadRequest, reason(err)
	case errors.Is(err, task.ErrNotFound), errors.Is(err, schedule.ErrNotFound), errors.Is(err, flow.ErrNotFound):
		code, msg = http.StatusNotFound, err.Error()
	default:
		d.log.Error("web: dashboard request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	d.render(w, r, code, "error", "Error", msg)
}

// action guards a form handler: read-only servers and read-only
// credentials refuse it, and the form must carry the CSRF token. The
// handler returns where to go next and a message code (flashes) for the
// user; the browser is redirected there (303), so a reload does not repeat
// the action.
func (d *dashboard) action(h func(r *http.Request) (to, msg string, err error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d.readOnly {
			d.render(w, r, http.StatusForbidden, "error", "Error", "this server is read-only")
			return
		}
		if readOnlyRequest(r) {
			d.render(w, r, http.StatusForbidden, "error", "Error", "this credential is read-only")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if err := r.ParseForm(); err != nil {
			d.fail(w, r, badInput("form", "%v", err))
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(d.csrf)) != 1 {
			d.render(w, r, http.StatusForbidden, "error", "Error", "missing or wrong csrf token: reload the page and try again")
			return
		}
		to, msg, err := h(r)
		if err != nil {
			d.fail(w, r, err)
			return
		}
		http.Redirect(w, r, withMsg(to, msg), http.StatusSeeOther)
	}
}

// withMsg adds the message code msg to the local path to as ?msg=, shown
// once on the page.
func withMsg(to, msg string) string {
	if !localPath(to) {
		to = "/" // only ever redirect within this server
	}
	if msg == "" {
		return to
	}
	sep := "?"
	if strings.Contains(to, "?") {
		sep = "&"
	}
	return to + sep + "msg=" + url.QueryEscape(msg)
}

// flashes are the messages a page shows for its ?msg= code. Only these
// (and bulkFlash's counts) are ever shown: a link carrying any other text
// shows nothing, so nobody can put their words on the dashboard.
var flashes = map[string]string{
	"cancelled":               "task cancelled",
	"retried":                 "task retried",
	"cancel-refused":          "not cancelled: the task has already finished",
	"retry-refused":           "not retried: the task has not finished",
	"flow-cancelled":          "flow cancelled",
	"flow-retried":            "flow retried",
	"flow-cancel-refused":     "not cancelled: the flow has already finished",
	"flow-retry-refused":      "not retried: the flow has not finished",
	"signal-sent":             "signal sent",
	"signal-twice":            "not sent: the step has its signal already, or its wait ended",
	"signal-finished":         "not sent: the flow is not running",
	"none-selected":           "no task selected",
	"paused":                  "paused",
	"already-paused":          "already paused",
	"resumed":                 "resumed",
	"not-paused":              "was not paused",
	"schedule-paused":         "schedule paused",
	"schedule-resumed":        "schedule resumed",
	"rollout-paused":          "rollout paused: running commands finish, nothing new is sent",
	"rollout-resumed":         "rollout resumed",
	"rollout-approved":        "next wave approved",
	"rollout-already-paused":  "the rollout was paused already",
	"rollout-not-paused":      "the rollout was not paused",
	"rollout-pause-refused":   "not paused: the rollout is not running",
	"rollout-resume-refused":  "not resumed: the rollout is not paused",
	"rollout-approve-refused": "not approved: no wave waits for an approval",
	"device-approved":         "device approved: rollouts may select it",
}

// bulkFlash is a bulk action's code: "cancelled-DONE-SKIPPED" or
// "retried-DONE-SKIPPED-FAILED", the counts in decimal.
var bulkFlash = regexp.MustCompile(`^(cancelled|retried)-([0-9]{1,9})-([0-9]{1,9})(?:-([0-9]{1,9}))?$`)

// bulkCode is the message code of a bulk action's counts.
func bulkCode(verb string, done, skipped, failed int) string {
	code := fmt.Sprintf("%s-%d-%d", verb, done, skipped)
	if failed > 0 {
		code += fmt.Sprintf("-%d", failed)
	}
	return code
}

// flashText is the message of code, "" for a code not known.
func flashText(code string) string {
	if msg, ok := flashes[code]; ok {
		return msg
	}
	m := bulkFlash.FindStringSubmatch(code)
	if m == nil {
		return ""
	}
	msg := fmt.Sprintf("%s %s, skipped %s", m[1], m[2], m[3])
	if m[4] != "" {
		msg += fmt.Sprintf(", failed %s (see the server log)", m[4])
	}
	return msg
}

// localPath reports whether to names a path on this server: it starts
// with one slash, and not "//" (browsers read it, and "/\\", as another
// host), and has no backslash and no control characters.
func localPath(to string) bool {
	if len(to) < 1 || to[0] != '/' || (len(to) > 1 && to[1] == '/') {
		return false
	}
	// No backslash anywhere: http.Redirect cleans the path, and
	// "/./\\evil.example" would come out as "/\\evil.example".
	return !strings.ContainsFunc(to, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' })
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := now.Sub(t)
		if d < 0 {
			return "in " + (-d).Round(time.Second).String()
		}
		return d.Round(time.Second).String() + " ago"
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"dur": func(d any) string {
		switch v := d.(type) {
		case task.Duration:
			return time.Duration(v).String()
		case time.Duration:
			return v.Round(time.Millisecond).String()
		}
		return fmt.Sprint(d)
	},
	"pct": func(n, of int) string {
		if of == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
	},
	"taskURL":           func(key string) string { return "/task?key=" + url.QueryEscape(key) },
	"rangeURL":          rangeURL,
	"rolloutURL":        rolloutURL,
	"rolloutDevicesURL": rolloutDevicesURL,
	"inc":               func(i int) int { return i + 1 },
	"join":              strings.Join,
	// visible escapes control and format characters (U+202E and kin) in
	// text the store holds: shown as what it is, it reorders nothing.
	"visible": safetext.Escape,
	// deviceID reports whether id is one a device may have: a form that
	// names a device (Approve) is offered for those only, so no id written
	// around the checks reaches the page raw.
	"deviceID": func(id string) bool { return mqttdev.ValidateID("device", id) == nil },
}
