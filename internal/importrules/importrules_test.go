package importrules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/leasepool/leasepool"

// pkg is what the rules read of one package: its non-test imports, direct
// and transitive, as module-relative paths ("task", "cmd/leasepool"); the
// module root is ".".
type pkg struct {
	Imports []string // direct
	Deps    []string // transitive
}

// Package sets the rules name. Each rule says what docs/DESIGN.md forbids,
// never a complete list of what is allowed, so a new package (or a new
// import that the design permits) does not need this file changed.
var (
	backends = []string{"task/sqlitestore", "task/mongostore"}
	// testOnly are made for tests and must never be linked into a program.
	testOnly = []string{"task/storetest", "task/memstore", "internal/tasktest", "internal/testutil", "internal/testservers", "tests"}
	// features are built on the consumer, so the consumer and the layers
	// under it must not import them.
	features = []string{"builtin", "mqttdev", "mqttdev/broker", "mqttdev/device", "mqttdev/protocol",
		"flow", "internal/retention", "rollout", "internal/bench", "web", "metrics", "internal/stats", "store"}
	// basics import task (and the lifecycle contract and the singleton
	// runner) only. The singleton runner is one: schedule, flow, retention
	// and mqttdev/broker are built on it. The engine packages (claim
	// decisions, lease renewal) are internal to consumer.
	basics = []string{preemptPkg, pingPkg, "control", "schedule", "trigger", "events", "internal/singleton"}
)

// The engine packages consumer ties together.
const (
	preemptPkg = "consumer/internal/preempt"
	pingPkg    = "consumer/internal/ping"
)

// tracingPkg wraps OpenTelemetry; it imports nothing of leasepool's, so
// every package may import it, task included.
const (
	tracingPkg    = "internal/tracing"
	tracingSDKPkg = "internal/tracing/tracingsdk"
)

// mochiPkg is the MQTT server the embedded broker runs, a patched copy of
// a published module (docs/decisions/0013).
const mochiPkg = "internal/mochi"

// rule is one sentence of docs/DESIGN.md in code. check returns the
// offending imports of p, or none.
type rule struct {
	name    string
	applies func(path string) bool
	check   func(path string, p pkg) []string
}

func is(paths ...string) func(string) bool {
	return func(path string) bool { return slices.Contains(paths, path) }
}

func under(prefix string) func(string) bool {
	return func(path string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }
}

func every(string) bool { return true }

// program reports whether path is a program: the CLI, or an example of
// a program of your own.
func program(path string) bool { return under("cmd")(path) || under("examples")(path) }

func production(path string) bool {
	for _, t := range testOnly {
		if under(t)(path) {
			return false
		}
	}
	return true
}

// in returns the elements of list for which match holds.
func in(list []string, match func(string) bool) []string {
	var out []string
	for _, s := range list {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func oneOf(sets ...[]string) func(string) bool {
	return func(path string) bool {
		for _, set := range sets {
			for _, s := range set {
				if under(s)(path) {
					return true
				}
			}
		}
		return false
	}
}

var rules = []rule{
	{
		name:    "internal/tracing imports nothing of leasepool's",
		applies: is(tracingPkg),
		check:   func(_ string, p pkg) []string { return p.Deps },
	},
	{
		name:    "task imports nothing of leasepool's but internal/tracing",
		applies: is("task"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, func(d string) bool { return d != tracingPkg })
		},
	},
	{
		name:    "a backend imports task only",
		applies: is(backends...),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, func(d string) bool { return d != "task" && d != tracingPkg })
		},
	},
	{
		name:    "consumer/internal/preempt, consumer/internal/ping, control, schedule, trigger, events and internal/singleton import task (and internal/lifecycle, internal/singleton) only",
		applies: is(basics...),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, func(d string) bool {
				return d != "task" && d != "internal/lifecycle" && d != "internal/singleton" && d != tracingPkg
			})
		},
	},
	{
		name:    "consumer ties task, its internal preempt and ping, and control together and knows nothing of the features built on it",
		applies: is("consumer"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, oneOf(features, backends))
		},
	},
	{
		name:    "the layers under the features never import them (metrics and web are imported only by what assembles a program)",
		applies: is(append(append([]string{"task", "consumer"}, basics...), backends...)...),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, oneOf(features))
		},
	},
	{
		name:    "only what assembles a program imports metrics or web",
		applies: is("builtin", "mqttdev", "mqttdev/broker", "mqttdev/device", "mqttdev/protocol", "flow", "internal/retention", "internal/bench", "store", "web", "metrics"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, is("metrics", "web"))
		},
	},
	{
		name:    "web and metrics reach a store only through task.Store",
		applies: is("web", "metrics"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, oneOf(backends, []string{"store"}))
		},
	},
	{
		name:    "flow knows nothing of devices (mqttdev imports flow, not the reverse)",
		applies: is("flow"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, under("mqttdev"))
		},
	},
	{
		name:    "the device side never imports the worker side",
		applies: is("mqttdev/device", "mqttdev/protocol"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, is("mqttdev", "mqttdev/broker"))
		},
	},
	{
		name:    "mqttdev/protocol is what both sides share and imports neither",
		applies: is("mqttdev/protocol"),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, is("mqttdev/device"))
		},
	},
	{
		name:    "a backend is imported directly only by store and programs (cmd, examples)",
		applies: func(path string) bool { return production(path) && path != "store" && !program(path) },
		check: func(_ string, p pkg) []string {
			return in(p.Imports, is(backends...))
		},
	},
	{
		name:    "worker assembles a worker process: only programs import it",
		applies: func(path string) bool { return production(path) && path != "worker" && !program(path) },
		check: func(_ string, p pkg) []string {
			return in(p.Deps, is("worker"))
		},
	},
	{
		name:    "only programs start the OpenTelemetry SDK (internal/tracing/tracingsdk): libraries make spans through the program's provider",
		applies: func(path string) bool { return production(path) && !under("cmd")(path) },
		check: func(_ string, p pkg) []string {
			return in(p.Deps, is(tracingSDKPkg))
		},
	},
	{
		name:    "no package imports cmd or examples",
		applies: every,
		check: func(_ string, p pkg) []string {
			return in(p.Deps, program)
		},
	},
	{
		name:    "internal/mochi, a copy of the published MQTT server, imports nothing of leasepool's but itself",
		applies: under(mochiPkg),
		check: func(_ string, p pkg) []string {
			return in(p.Deps, func(d string) bool { return !under(mochiPkg)(d) })
		},
	},
	{
		name:    "only mqttdev/broker imports internal/mochi",
		applies: func(path string) bool { return path != "mqttdev/broker" && !under(mochiPkg)(path) },
		check: func(_ string, p pkg) []string {
			return in(p.Imports, under(mochiPkg))
		},
	},
	{
		name:    "packages made for tests are never imported by production code",
		applies: production,
		check: func(_ string, p pkg) []string {
			return in(p.Deps, oneOf(testOnly))
		},
	},
}

// violations applies every rule to every package of graph, in a stable
// order.
func violations(graph map[string]pkg) []string {
	paths := make([]string, 0, len(graph))
	for path := range graph {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	var out []string
	for _, r := range rules {
		for _, path := range paths {
			if !r.applies(path) {
				continue
			}
			for _, bad := range r.check(path, graph[path]) {
				out = append(out, fmt.Sprintf("%s imports %s: %s", path, bad, r.name))
			}
		}
	}
	return out
}

// TestImportRules checks the module's real import graph, as `go list`
// reports it for this build, against docs/DESIGN.md's rules.
func TestImportRules(t *testing.T) {
	graph, err := loadGraph()
	if err != nil {
		t.Fatal(err)
	}
	// The graph must be the real one: a go list that answered nothing
	// would pass every rule.
	for _, want := range []string{"task", "consumer", preemptPkg, pingPkg, "web", "metrics", "cmd/leasepool", "task/sqlitestore", "mqttdev/device"} {
		if _, ok := graph[want]; !ok {
			t.Fatalf("go list did not report package %s; the graph read is incomplete", want)
		}
	}
	if !slices.Contains(graph["cmd/leasepool"].Deps, "task") {
		t.Fatalf("cmd/leasepool's dependencies do not include task: %v", graph["cmd/leasepool"].Deps)
	}
	for _, v := range violations(graph) {
		t.Error(v)
	}
}

// TestRulesCatchViolations feeds the rules a graph that breaks each of
// them once, and a graph that keeps them, so a rule that can never fail
// (a typo in a package path, an inverted check) is caught.
func TestRulesCatchViolations(t *testing.T) {
	good := map[string]pkg{
		"task":                   {Imports: []string{tracingPkg}, Deps: []string{tracingPkg}},
		tracingPkg:               {},
		"task/sqlitestore":       {Imports: []string{"task"}, Deps: []string{"task", tracingPkg}},
		preemptPkg:               {Imports: []string{"task"}, Deps: []string{"task"}},
		pingPkg:                  {Imports: []string{"task"}, Deps: []string{"task"}},
		"schedule":               {Imports: []string{"task", "internal/lifecycle"}, Deps: []string{"task", "internal/lifecycle"}},
		"consumer":               {Imports: []string{"task", preemptPkg, pingPkg, "control"}, Deps: []string{"task", preemptPkg, pingPkg, "control", "internal/lifecycle"}},
		"flow":                   {Imports: []string{"consumer", "task"}, Deps: []string{"consumer", "task", preemptPkg}},
		"mqttdev":                {Imports: []string{"flow", "mqttdev/broker"}, Deps: []string{"flow", "mqttdev/broker", "mqttdev/protocol", "task"}},
		"mqttdev/device":         {Imports: []string{"mqttdev/protocol"}, Deps: []string{"mqttdev/protocol", "task"}},
		"web":                    {Imports: []string{"task", "flow", "mqttdev"}, Deps: []string{"task", "flow", "mqttdev"}},
		"metrics":                {Imports: []string{"consumer", "mqttdev"}, Deps: []string{"consumer", "mqttdev", "task"}},
		"store":                  {Imports: []string{"task/sqlitestore"}, Deps: []string{"task/sqlitestore", "task"}},
		"cmd/leasepool":          {Imports: []string{"web", "metrics", "store", "task/sqlitestore", "worker"}, Deps: []string{"web", "metrics", "store", "task/sqlitestore", "task", "worker"}},
		"worker":                 {Imports: []string{"consumer", "metrics", "flow"}, Deps: []string{"consumer", "metrics", "flow", "task"}},
		"task/storetest":         {Imports: []string{"task", "internal/tasktest"}, Deps: []string{"task", "internal/tasktest"}},
		"mqttdev/broker":         {Imports: []string{mochiPkg, mochiPkg + "/listeners"}, Deps: []string{mochiPkg, mochiPkg + "/listeners", "internal/singleton", "task"}},
		mochiPkg + "/hooks/auth": {Imports: []string{mochiPkg}, Deps: []string{mochiPkg}},
		"newfeature":             {Imports: []string{"consumer", "metrics"}, Deps: []string{"consumer", "metrics", "task"}},
	}
	if v := violations(good); len(v) != 0 {
		t.Fatalf("a graph that keeps the rules was refused:\n%s", strings.Join(v, "\n"))
	}

	bad := []struct {
		pkg, imports, rule string
	}{
		{"task", "internal/lifecycle", "task imports nothing"},
		{tracingPkg, "task", "internal/tracing imports nothing"},
		{"worker", tracingSDKPkg, "only programs start the OpenTelemetry SDK"},
		{"task/mongostore", "control", "a backend imports task only"},
		{"events", "consumer", "import task (and internal/lifecycle, internal/singleton) only"},
		{preemptPkg, "control", "import task (and internal/lifecycle, internal/singleton) only"},
		{pingPkg, "consumer", "import task (and internal/lifecycle, internal/singleton) only"},
		{preemptPkg, "web", "never import them"},
		{"internal/singleton", "flow", "import task (and internal/lifecycle, internal/singleton) only"},
		{"consumer", "mqttdev", "knows nothing of the features"},
		{"control", "metrics", "never import them"},
		{"flow", "metrics", "only what assembles a program"},
		{"metrics", "web", "only what assembles a program"},
		{"web", "metrics", "only what assembles a program"},
		{"web", "task/sqlitestore", "only through task.Store"},
		{"metrics", "store", "only through task.Store"},
		{"flow", "mqttdev", "flow knows nothing of devices"},
		{"mqttdev/device", "mqttdev", "the device side never imports the worker side"},
		{"mqttdev/protocol", "mqttdev/device", "imports neither"},
		{"newfeature", "task/mongostore", "imported directly only by store and programs"},
		{"web", "cmd/leasepool", "no package imports cmd"},
		{"flow", "worker", "only programs import it"},
		{"consumer", "internal/testutil", "never imported by production code"},
		{"newfeature", "task/storetest", "never imported by production code"},
		{"web", "task/memstore", "never imported by production code"},
		{mochiPkg, "task", "imports nothing of leasepool's but itself"},
		{mochiPkg + "/listeners", "internal/lifecycle", "imports nothing of leasepool's but itself"},
		{"mqttdev", mochiPkg, "only mqttdev/broker imports internal/mochi"},
		{"mqttdev/device", mochiPkg + "/packets", "only mqttdev/broker imports internal/mochi"},
	}
	for _, b := range bad {
		graph := make(map[string]pkg, len(good))
		for k, v := range good {
			graph[k] = v
		}
		p := graph[b.pkg]
		p.Imports = append(slices.Clone(p.Imports), b.imports)
		p.Deps = append(slices.Clone(p.Deps), b.imports)
		graph[b.pkg] = p
		found := false
		for _, v := range violations(graph) {
			if strings.HasPrefix(v, b.pkg+" imports "+b.imports+":") && strings.Contains(v, b.rule) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s importing %s was not refused by the rule %q; got %q", b.pkg, b.imports, b.rule, violations(graph))
		}
	}
}

// loadGraph runs `go list -json` on every package of the module, from the
// module's root.
func loadGraph() (map[string]pkg, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	graph := make(map[string]pkg)
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath    string
			Imports, Deps []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		path, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		graph[path] = pkg{Imports: rels(p.Imports), Deps: rels(p.Deps)}
	}
	return graph, nil
}

// rel turns an import path of this module into a module-relative one.
func rel(importPath string) (string, bool) {
	if importPath == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(importPath, module+"/")
	return r, ok
}

// rels keeps the paths of this module, module-relative.
func rels(paths []string) []string {
	var out []string
	for _, p := range paths {
		if r, ok := rel(p); ok {
			out = append(out, r)
		}
	}
	return out
}

// maxPublic bounds the importable packages outside internal/, tests and
// cmd: what a user needs (the model and its stores, the worker and what
// runs on it, the controls, the HTTP surface), the engine behind consumer.
const maxPublic = 21

// TestPublicSurface: a new public package is a decision, not a drift.
func TestPublicSurface(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{if ne .Name "main"}}{{.ImportPath}}{{end}}`, module+"/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	var public []string
	for _, path := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		if strings.Contains("/"+rel+"/", "/internal/") || under("tests")(rel) || under("cmd")(rel) {
			continue
		}
		public = append(public, rel)
	}
	if len(public) > maxPublic || len(public) == 0 {
		t.Fatalf("%d importable packages outside internal/, tests and cmd, at most %d: %v", len(public), maxPublic, public)
	}
}
