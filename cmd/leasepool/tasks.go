package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

func publishCommand() *cli.Command {
	return &cli.Command{
		Name:      "publish",
		Usage:     "publish a task idempotently, keyed by name, or many from a file",
		ArgsUsage: "KEY | --file F",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "file", Usage: "publish every line of this file (- for stdin): JSON lines, each a task body as POST /api/v1/tasks takes it"},
			&cli.DurationFlag{Name: "delay", Usage: "not claimable before this long from now", DefaultText: "none"},
			&cli.BoolFlag{Name: "rerun", Usage: "run a finished task again"},
			&cli.DurationFlag{Name: "debounce", Usage: "run this long after the key's latest publish: publishing the key again while its task is pending (never claimed) replaces the payload and moves the run time; at most " + task.MaxDebounce.String(), DefaultText: "off: publishing an existing key leaves it alone"},
			&cli.BoolFlag{Name: "json", Usage: "print the task as JSON"},
		}, taskFlags()...),
		Action: func(c *cli.Context) error {
			if c.IsSet("file") {
				return publishFile(c)
			}
			p, err := publishParams(c)
			if err != nil {
				if errors.Is(err, task.ErrInvalid) {
					return &usageError{cmd: c.Command.HelpName, err: err}
				}
				return err
			}
			kinds := []kindRef{{"--kind", p.Kind}}
			if err := refuseKindsWithoutWorker(c, kinds); err != nil {
				return err
			}
			s, err := openStore(c, false)
			if err != nil {
				return err
			}
			defer s.Close()
			ctx, err := publishContext(c)
			if err != nil {
				return err
			}
			t, res, err := task.Publish(ctx, s, p)
			if err != nil {
				return err
			}
			warnKindsWithoutWorker(c, s, kinds)
			if c.Bool("json") {
				return writeJSON(c.App.Writer, t)
			}
			fmt.Fprintf(c.App.Writer, "%s %s (%s, attempts %d)\n", res, t.Key, t.State, t.AttemptsStarted)
			return nil
		},
	}
}

// taskFlags are the flags of a task's kind, payload and options, shared
// by publish and schedule add.
func taskFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kind", Usage: "the handler that runs it: a built-in kind (" + strings.Join(builtinKinds(), ", ") +
			"), whose payload is checked, or any kind your workers register (required)"},
		strictFlag(),
		&cli.StringFlag{Name: "payload", Usage: "payload JSON; - reads it from stdin (default: {})"},
		&cli.StringFlag{Name: "payload-file", Usage: "read the payload JSON from this file"},
		&cli.IntFlag{Name: "priority", Usage: "higher runs first"},
		&cli.StringFlag{Name: "pin", Usage: "comma-separated worker ids allowed to run it", DefaultText: "any worker"},
		&cli.IntFlag{Name: "workers", Value: 1, Usage: "workers running it at the same time"},
		&cli.IntFlag{Name: "successes", Value: 1, Usage: "successful workers that finish it"},
		&cli.IntFlag{Name: "retries", Value: task.DefaultMaxUnexpectedRetries, Usage: "failed or expired workers tolerated before it fails"},
		&cli.DurationFlag{Name: "ping", Usage: fmt.Sprintf("lease renewal interval; at least %s", task.MinPingInterval),
			DefaultText: "1s, or --timeout/4 when only that is given"},
		&cli.DurationFlag{Name: "timeout", Usage: fmt.Sprintf("lease length; above --ping and at least %s", task.MinWorkerTimeout),
			DefaultText: "4s, or 4×--ping (at least 100ms) when only that is given"},
		&cli.StringFlag{Name: "lock", Usage: "comma-separated resources held exclusively while it runs"},
		&cli.StringFlag{Name: "group", Usage: "the group (tenant) it runs as: groups share the workers by weight, and a group's concurrency limit counts it"},
	}
}

// taskFlagNames are the names of taskFlags.
func taskFlagNames() []string {
	var names []string
	for _, f := range taskFlags() {
		names = append(names, f.Names()[0])
	}
	return names
}

// publishParams reads and validates every publish flag before anything is
// opened, so bad input writes nothing.
func publishParams(c *cli.Context) (task.PublishParams, error) {
	if c.NArg() != 1 {
		return task.PublishParams{}, badUsage(c, "want exactly one KEY argument, got %d", c.NArg())
	}
	delay, err := positiveDuration(c, "delay")
	if err != nil {
		return task.PublishParams{}, err
	}
	var runAt time.Time
	if delay > 0 {
		runAt = time.Now().Add(delay)
	}
	var debounce time.Duration
	if c.IsSet("debounce") {
		debounce = c.Duration("debounce")
		if err := task.ValidateDebounce("--debounce", debounce); err != nil {
			return task.PublishParams{}, err
		}
	}
	p, err := taskParams(c, c.Args().First(), runAt)
	p.Rerun, p.Debounce = c.Bool("rerun"), debounce
	return p, err
}

// taskParams reads and validates the taskFlags into a publish of key.
func taskParams(c *cli.Context, key string, runAt time.Time) (task.PublishParams, error) {
	p := task.PublishParams{Key: key}
	if !c.IsSet("kind") {
		return p, badFlag(c, "kind", "required: a built-in kind (%s) or one your workers register", strings.Join(builtinKinds(), ", "))
	}
	p.Kind, p.RunAt = c.String("kind"), runAt
	if err := task.ValidateName("--kind", p.Kind); err != nil {
		return p, err
	}
	payload, err := readPayload(c)
	if err != nil {
		return p, err
	}
	p.Payload = payload
	// The built-in kinds' payloads are checked here; a device command's
	// below. Other kinds are a library user's handlers: the payload is
	// theirs to read.
	if slices.Contains(builtin.Kinds, p.Kind) {
		if err := builtin.Validate(p.Kind, p.Payload); err != nil {
			return p, fmt.Errorf("--payload: %w", err)
		}
	}
	for _, name := range []string{"ping", "timeout"} {
		if _, err := positiveDuration(c, name); err != nil {
			return p, err
		}
	}
	p.PingInterval, p.WorkerTimeout = c.Duration("ping"), c.Duration("timeout")
	if c.IsSet("ping") && c.IsSet("timeout") && p.WorkerTimeout <= p.PingInterval {
		return p, badFlag(c, "timeout", "%s must be above --ping %s", p.WorkerTimeout, p.PingInterval)
	}
	for _, f := range []string{"workers", "successes"} {
		if c.Int(f) < 1 {
			return p, badFlag(c, f, "must be at least 1, got %d", c.Int(f))
		}
	}
	if c.Int("retries") < 0 {
		return p, badFlag(c, "retries", "must not be negative, got %d", c.Int("retries"))
	}
	p.Priority = c.Int("priority")
	if p.SpecificWorkerIDs, err = listFlag(c, "pin"); err != nil {
		return p, err
	}
	p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = c.Int("workers"), c.Int("successes")
	p.MaxUnexpectedRetries = c.Int("retries")
	if p.MaxUnexpectedRetries == 0 {
		p.MaxUnexpectedRetries = task.NoRetries
	}
	if p.LockKeys, err = listFlag(c, "lock"); err != nil {
		return p, err
	}
	if c.IsSet("group") {
		p.Group = c.String("group")
		if err := task.ValidateName("group", p.Group); err != nil {
			return p, badFlag(c, "group", "%v", err)
		}
	}
	if p.Kind == mqttdev.Kind {
		// A device command: the device's lock key serialises it cluster-wide.
		cmd, err := mqttdev.DecodePayload(p.Payload)
		if err != nil {
			return p, fmt.Errorf("--payload: %w", err)
		}
		// PublishParams validates the whole publish.
		return mqttdev.PublishParams(p.Key, cmd, p.Options)
	}
	// Validate now so that every error is reported before the store is
	// touched (task.Publish checks again; Validate changes nothing).
	return p, p.Validate()
}

// readPayload reads the payload from --payload (- for stdin) or
// --payload-file, at most task.MaxPayloadSize bytes of JSON; nil when
// neither is given.
func readPayload(c *cli.Context) (json.RawMessage, error) {
	var name string
	var r io.Reader
	switch {
	case c.IsSet("payload") && c.IsSet("payload-file"):
		return nil, badFlag(c, "payload-file", "give --payload or --payload-file, not both")
	case c.IsSet("payload-file"):
		name = "payload-file"
		f, err := os.Open(c.String("payload-file"))
		if err != nil {
			return nil, badFlag(c, "payload-file", "%w", err)
		}
		defer f.Close()
		r = f
	case c.String("payload") == "-":
		name, r = "payload", c.App.Reader
	case c.IsSet("payload"):
		name, r = "payload", strings.NewReader(c.String("payload"))
	default:
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, task.MaxPayloadSize+1))
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", name, err)
	}
	if len(b) > task.MaxPayloadSize {
		return nil, badFlag(c, name, "payload is more than the limit of %d bytes", task.MaxPayloadSize)
	}
	b = bytes.TrimSpace(b)
	if !json.Valid(b) {
		return nil, badFlag(c, name, "not valid JSON: %.80q", b)
	}
	return json.RawMessage(b), nil
}

func lsCommand() *cli.Command {
	return &cli.Command{
		Name:  "ls",
		Usage: "list tasks",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "state", Usage: "pending, running, succeeded, failed or cancelled"},
			&cli.StringFlag{Name: "kind"},
			&cli.IntFlag{Name: "limit", Value: 1000, Usage: "at most this many tasks (0: all)"},
			&cli.Int64Flag{Name: "after", Usage: "continue after the task of this seq (as the last page's note says)"},
			&cli.BoolFlag{Name: "json", Usage: "print a JSON array"},
		},
		Action: func(c *cli.Context) error {
			q := task.ListQuery{Kind: c.String("kind"), Limit: c.Int("limit"), AfterSeq: c.Int64("after")}
			if c.IsSet("state") {
				st, err := task.ParseState(c.String("state"))
				if err != nil {
					return badUsage(c, "--state: %w", err)
				}
				q.State = st
			}
			if q.Limit < 0 {
				return badFlag(c, "limit", "must not be negative")
			}
			if q.AfterSeq < 0 {
				return badFlag(c, "after", "must not be negative")
			}
			s, err := openStoreReadOnly(c)
			if err != nil {
				return err
			}
			defer s.Close()
			if q.Limit > 0 {
				q.Limit++ // one more tells whether the list stopped at the limit
			}
			tasks, err := s.List(c.Context, q)
			if err != nil {
				return err
			}
			if q.Limit > 0 && len(tasks) == q.Limit {
				tasks = tasks[:len(tasks)-1]
				fmt.Fprintf(c.App.ErrWriter, "showing the first %d tasks; more with --after %d\n", len(tasks), tasks[len(tasks)-1].Seq)
			}
			if c.Bool("json") {
				if tasks == nil {
					tasks = []*task.Task{}
				}
				return writeJSON(c.App.Writer, tasks)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tKIND\tSTATE\tPRIORITY\tWORKERS\tATTEMPTS\tUPDATED")
			for _, t := range tasks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\n", t.Key, t.Kind, t.State, t.Priority,
					workerSummary(t), t.AttemptsStarted, t.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

func workerSummary(t *task.Task) string {
	if len(t.Attempts) == 0 {
		return "-"
	}
	var parts []string
	for _, w := range t.Attempts {
		parts = append(parts, fmt.Sprintf("%s:%s", w.WorkerID, w.State))
	}
	return strings.Join(parts, ",")
}

func showCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Usage:     "show one task",
		ArgsUsage: "KEY",
		Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the task document as JSON"}},
		Action: withTaskReadOnly(func(c *cli.Context, s task.Store, key string) error {
			t, err := s.Get(c.Context, key)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return writeJSON(c.App.Writer, t)
			}
			var waiting string
			if t.State == task.StatePending {
				if waiting, err = waitingFor(c.Context, s, t); err != nil {
					return err
				}
			}
			return printTask(c.App.Writer, t, waiting)
		}),
	}
}

// printTask prints t's fields and attempts; waiting, when not empty, is
// what a pending t waits for (waitingFor).
func printTask(w io.Writer, t *task.Task, waiting string) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("key", t.Key)
	row("kind", t.Kind)
	row("state", t.State)
	if waiting != "" {
		row("waiting", waiting)
	}
	row("payload", string(t.Payload))
	row("priority", t.Priority)
	row("run_at", t.RunAt.Local().Format(time.RFC3339Nano))
	if len(t.SpecificWorkerIDs) > 0 {
		row("specific_worker_ids", strings.Join(t.SpecificWorkerIDs, ","))
	}
	row("concurrent_worker_cnt", t.ConcurrentWorkerCnt)
	row("success_worker_cnt", t.SuccessWorkerCnt)
	row("max_unexpected_retries", t.MaxUnexpectedRetries)
	row("ping_interval", time.Duration(t.PingInterval))
	row("worker_timeout", time.Duration(t.WorkerTimeout))
	if t.Group != "" {
		row("group", t.Group)
	}
	if len(t.LockKeys) > 0 {
		row("lock_keys", strings.Join(t.LockKeys, ","))
	}
	row("attempts", t.AttemptsStarted)
	row("version", t.Version)
	row("created", t.CreatedAt.Local().Format(time.RFC3339Nano))
	row("updated", t.UpdatedAt.Local().Format(time.RFC3339Nano))
	if err := tw.Flush(); err != nil {
		return err
	}
	printAttempts(w, t)
	return nil
}

func cancelCommand() *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a task; its running handlers are cancelled at once",
		ArgsUsage: "KEY",
		Action: withTask(func(c *cli.Context, s task.Store, key string) error {
			t, err := task.Cancel(c.Context, s, key)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "cancelled %s\n", t.Key)
			return nil
		}),
	}
}

func retryCommand() *cli.Command {
	return &cli.Command{
		Name:      "retry",
		Usage:     "run a finished (failed, cancelled or succeeded) task again",
		ArgsUsage: "KEY",
		Action: withTask(func(c *cli.Context, s task.Store, key string) error {
			t, err := task.Retry(c.Context, s, key)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "retrying %s (%s)\n", t.Key, t.State)
			return nil
		}),
	}
}

// withTask checks the KEY argument and opens the store for fn.
func withTask(fn func(c *cli.Context, s task.Store, key string) error) cli.ActionFunc {
	return withTaskStore(func(c *cli.Context) (task.Store, error) { return openStore(c, true) }, fn)
}

// withTaskReadOnly is withTask for commands that only read.
func withTaskReadOnly(fn func(c *cli.Context, s task.Store, key string) error) cli.ActionFunc {
	return withTaskStore(openStoreReadOnly, fn)
}

func withTaskStore(open func(*cli.Context) (task.Store, error), fn func(c *cli.Context, s task.Store, key string) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() != 1 {
			return badUsage(c, "want exactly one KEY argument, got %d", c.NArg())
		}
		s, err := open(c)
		if err != nil {
			return err
		}
		defer s.Close()
		return fn(c, s, c.Args().First())
	}
}

func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeFormatChars(b.Bytes()))
	return err
}

// builtinKinds are the kinds the leasepool worker runs: builtin.Kinds and
// the device kind.
func builtinKinds() []string {
	return append(slices.Clone(builtin.Kinds), mqttdev.Kind)
}

// strictFlag is --strict of the commands that publish tasks.
func strictFlag() cli.Flag {
	return &cli.BoolFlag{Name: "strict", Usage: "refuse a kind that no live worker runs (exit 2, nothing written) instead of warning"}
}

// kindRef is a kind a command publishes and the field that names it.
type kindRef struct{ field, kind string }

// refuseKindsWithoutWorker refuses, under --strict, a kind that no live
// worker runs, before anything is written: the registry is read through a
// read-only open, and a missing store file has no workers at all (it is not
// created).
func refuseKindsWithoutWorker(c *cli.Context, refs []kindRef) error {
	if !c.Bool("strict") {
		return nil
	}
	kinds := make([]string, len(refs))
	for i, r := range refs {
		kinds[i] = r.kind
	}
	var missing []task.NoWorker
	s, err := openStoreReadOnly(c)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		missing = []task.NoWorker{{Kind: kinds[0]}}
	case err != nil:
		return err
	default:
		defer s.Close()
		if missing, err = task.KindsWithoutWorker(c.Context, s, s.Now(), kinds...); err != nil {
			return err
		}
	}
	if len(missing) == 0 {
		return nil
	}
	i := slices.IndexFunc(refs, func(r kindRef) bool { return r.kind == missing[0].Kind })
	return missing[0].Refusal(refs[i].field)
}

// warnKindsWithoutWorker prints one warning line on stderr for each kind
// of refs that no live worker runs: the task is stored and waits, and a
// mistyped kind looks just like this.
func warnKindsWithoutWorker(c *cli.Context, s task.Store, refs []kindRef) {
	kinds := make([]string, len(refs))
	for i, r := range refs {
		kinds[i] = r.kind
	}
	missing, err := task.KindsWithoutWorker(c.Context, s, s.Now(), kinds...)
	if err != nil {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", oneLine(err))
		return
	}
	for _, n := range missing {
		fmt.Fprintf(c.App.ErrWriter, "warning: %s\n", n.Warning())
	}
}
