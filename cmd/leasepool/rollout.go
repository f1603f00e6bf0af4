package main

// `leasepool rollout create|ls|show|pause|resume|cancel|approve|retry-failed|delete`:
// one device command sent to a fleet in waves (package rollout); every
// `leasepool worker` runs the driver, one at a time.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

func rolloutCommand() *cli.Command {
	nameAction := func(op func(c *cli.Context, s task.Store, name string) (*rollout.Rollout, error)) cli.ActionFunc {
		return storeAction(rolloutName, op, func(w io.Writer, r *rollout.Rollout) {
			fmt.Fprintf(w, "rollout %s: %s%s\n", r.Name, r.State, reasonSuffix(r.Reason))
		})
	}
	// nameOp is nameAction of a rollout operation that needs nothing of
	// the command line but the name.
	nameOp := func(op func(context.Context, task.Store, string) (*rollout.Rollout, error)) cli.ActionFunc {
		return nameAction(func(c *cli.Context, s task.Store, n string) (*rollout.Rollout, error) {
			return op(c.Context, s, n)
		})
	}
	return &cli.Command{
		Name:  "rollout",
		Usage: "send one device command to a fleet in waves, at a bounded rate, with abort rules and a rollback",
		Subcommands: []*cli.Command{
			{
				Name: "create", Usage: "create a rollout (the workers' driver runs it)", ArgsUsage: "NAME",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "command", Required: true, Usage: "the device command"},
					&cli.StringFlag{Name: "args", Usage: "the command's arguments, a JSON object"},
					&cli.StringFlag{Name: "select", Usage: "devices by inventory labels: k=v,k!=v,..."},
					&cli.StringFlag{Name: "devices", Usage: "devices by id: ID,ID,..."},
					&cli.StringFlag{Name: "waves", Value: "100%", Usage: "cumulative wave targets, counts or percentages, the last 100%"},
					&cli.BoolFlag{Name: "approve-waves", Usage: "every wave after the first waits for `rollout approve`"},
					&cli.Float64Flag{Name: "gate-failures", Usage: "a wave failing this percentage or more holds the next for approval", DefaultText: "the lowest --abort-when percentage"},
					&cli.StringFlag{Name: "rate", Usage: "at most N devices sent the command per DURATION: N/DURATION, e.g. 20/1m"},
					&cli.StringFlag{Name: "abort-when", Usage: "abort rules, ';'-separated: KIND[|KIND]>P% [after N], KIND failed, refused, timed_out, offline or any"},
					&cli.DurationFlag{Name: "timeout", Usage: "each device's time to send its result once it acked", DefaultText: mqttdev.DefaultResultTimeout.String()},
					&cli.DurationFlag{Name: "offline-limit", Usage: "how long a command waits for an offline device before it counts as offline", DefaultText: rollout.DefaultOfflineLimit.String()},
					&cli.IntFlag{Name: "retries", Usage: "more attempts per device after a failure"},
					&cli.StringFlag{Name: "retry-on", Usage: "failure kinds retried (default any): failed,refused,timed_out,offline"},
					&cli.StringFlag{Name: "rollback-command", Usage: "run on every device that succeeded when the rollout aborts"},
					&cli.StringFlag{Name: "rollback-args", Usage: "the rollback command's arguments, a JSON object"},
					&cli.IntFlag{Name: "priority", Usage: "priority of the device tasks"},
					&cli.BoolFlag{Name: "dry-run", Usage: "print the devices of each wave and write nothing"},
					&cli.BoolFlag{Name: "json", Usage: "print the rollout's progress (with --dry-run its plan) as JSON"},
				},
				Action: rolloutCreate,
			},
			{
				Name: "ls", Usage: "list rollouts, newest first",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print a JSON array of progress"}},
				Action: rolloutList,
			},
			{
				Name: "show", Usage: "print a rollout: state, waves with their counts and gates, thresholds, events", ArgsUsage: "NAME",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "json", Usage: "print the progress as JSON"},
					&cli.BoolFlag{Name: "devices", Usage: "list the devices' executions too, a page of them (--offset, --limit, --outcome)"},
					&cli.IntFlag{Name: "offset", Usage: "with --devices: the first execution listed, counted from 0"},
					&cli.IntFlag{Name: "limit", Value: 1000, Usage: "with --devices: how many executions to list (0: every one)"},
					&cli.StringFlag{Name: "outcome", Usage: "with --devices: list the executions of this outcome alone (queued, running, succeeded, failed, ...)"},
				},
				Action: rolloutShow,
			},
			{
				Name: "pause", Usage: "dispatch nothing more until resumed (running commands finish)", ArgsUsage: "NAME",
				Action: nameOp(rollout.Pause),
			},
			{
				Name: "resume", Usage: "resume a paused rollout", ArgsUsage: "NAME",
				Action: nameOp(rollout.Resume),
			},
			{
				Name: "cancel", Usage: "stop for good: queued commands are withdrawn, running ones finish; no rollback", ArgsUsage: "NAME",
				Action: nameOp(rollout.Cancel),
			},
			{
				Name: "approve", Usage: "open the next wave's gate", ArgsUsage: "NAME",
				Action: nameOp(rollout.Approve),
			},
			{
				Name: "retry-failed", Usage: "give every failed device another attempt", ArgsUsage: "NAME",
				Action: nameAction(func(c *cli.Context, s task.Store, n string) (*rollout.Rollout, error) {
					r, n2, err := rollout.RetryFailed(c.Context, s, n)
					if err == nil {
						fmt.Fprintf(c.App.Writer, "%d devices to retry\n", n2)
					}
					return r, err
				}),
			},
			{
				Name: "delete", Usage: "delete a rollout that is over (cancel a running one first, then delete it once cancelled); its device tasks stay", ArgsUsage: "NAME",
				Action: storeAction(rolloutName, func(c *cli.Context, s task.Store, n string) (*rollout.Rollout, error) {
					return rollout.Delete(c.Context, s, n)
				}, func(w io.Writer, r *rollout.Rollout) {
					fmt.Fprintf(w, "rollout %s deleted (it was %s)\n", r.Name, r.State)
				}),
			},
		},
	}
}

func rolloutName(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", badUsage(c, "want exactly one NAME argument, got %d", c.NArg())
	}
	name := c.Args().First()
	if err := rollout.ValidateName(name); err != nil {
		return "", err
	}
	return name, nil
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return " (" + reason + ")"
}

// rolloutSpec reads the create flags; every error names its flag and
// nothing is written.
func rolloutSpec(c *cli.Context) (rollout.Spec, error) {
	spec := rollout.Spec{Command: c.String("command"), Select: c.String("select"), ApproveWaves: c.Bool("approve-waves"),
		GateFailures: c.Float64("gate-failures"), RollbackCommand: c.String("rollback-command"), Priority: c.Int("priority"), Retries: c.Int("retries")}
	if v := c.String("args"); v != "" {
		spec.Args = json.RawMessage(v)
	}
	if v := c.String("rollback-args"); v != "" {
		spec.RollbackArgs = json.RawMessage(v)
	}
	var err error
	if spec.Devices, err = listFlag(c, "devices"); err != nil {
		return spec, err
	}
	if spec.Waves, err = rollout.ParseWaves(c.String("waves")); err != nil {
		return spec, badFlag(c, "waves", "%v", err)
	}
	if v := c.String("rate"); v != "" {
		if spec.Rate, err = rollout.ParseRate(v); err != nil {
			return spec, badFlag(c, "rate", "%v", err)
		}
	}
	if v := c.String("abort-when"); v != "" {
		if spec.AbortWhen, err = rollout.ParseAbortRules(v); err != nil {
			return spec, badFlag(c, "abort-when", "%v", err)
		}
	}
	if v := c.String("retry-on"); v != "" {
		if spec.RetryOn, err = rollout.ParseRetryOn(v); err != nil {
			return spec, badFlag(c, "retry-on", "%v", err)
		}
	}
	for _, d := range []struct {
		name string
		dst  *task.Duration
	}{{"timeout", &spec.Timeout}, {"offline-limit", &spec.OfflineLimit}} {
		v, err := positiveDuration(c, d.name)
		if err != nil {
			return spec, err
		}
		*d.dst = task.Duration(v)
	}
	if err := spec.Validate(); err != nil {
		return spec, fmt.Errorf("rollout create: %w", err)
	}
	return spec, nil
}

func rolloutCreate(c *cli.Context) error {
	name, err := rolloutName(c)
	if err != nil {
		return err
	}
	spec, err := rolloutSpec(c)
	if err != nil {
		return err
	}
	if c.Bool("dry-run") {
		return rolloutDryRun(c, name, spec)
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
	r, err := rollout.Create(ctx, s, name, spec)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, r.Progress())
	}
	fmt.Fprintf(c.App.Writer, "rollout %s created: %d devices in %d waves\n", r.Name, r.DeviceCount, len(r.Waves))
	return nil
}

// rolloutDryRun prints what create would do, the devices of each wave,
// from a store opened read-only.
func rolloutDryRun(c *cli.Context, name string, spec rollout.Spec) error {
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := rollout.DryRun(c.Context, s, name, spec)
	if err != nil {
		return err
	}
	p := r.Plan()
	if c.Bool("json") {
		return writeJSON(c.App.Writer, p)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "rollout %s (dry run, nothing written): %s to %d devices in %d waves\n", p.Name, p.Command, p.Devices, len(p.Waves))
	for _, wv := range p.Waves {
		fmt.Fprintf(w, "wave %d: target %s (%d), gate %s, %d devices: %s\n", wv.Index+1, wv.Spec, wv.Target, wv.Gate, len(wv.Devices),
			strings.Join(wv.Devices, ","))
	}
	return nil
}

func rolloutList(c *cli.Context) error {
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	list, err := rollout.List(c.Context, s)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		out := make([]rollout.Progress, 0, len(list))
		for _, r := range list {
			out = append(out, r.Progress())
		}
		return writeJSON(c.App.Writer, out)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tWAVE\tDEVICES\tSUCCEEDED\tFAILED\tRUNNING\tCOMMAND\tCREATED")
	for _, r := range list {
		p := r.Progress()
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.State, p.Wave+1, len(p.Waves), p.Total.Total,
			p.Total.Succeeded, p.Total.Failures(), p.Total.Running, p.Spec.Command, p.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

func rolloutShow(c *cli.Context) error {
	name, err := rolloutName(c)
	if err != nil {
		return err
	}
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	// The aggregates: one document, however many devices.
	r, err := rollout.GetHead(c.Context, s, name)
	if err != nil {
		return err
	}
	var page *rollout.Page
	if c.Bool("devices") {
		offset, limit := c.Int("offset"), c.Int("limit")
		var outcome rollout.Outcome
		if v := c.String("outcome"); v != "" {
			if outcome, err = rollout.ParseOutcome("outcome", v); err != nil {
				return err
			}
		}
		switch {
		case offset < 0:
			return fmt.Errorf("--offset: %d is negative", offset)
		case limit < 0:
			return fmt.Errorf("--limit: %d is negative", limit)
		case limit == 0:
			limit = r.DeviceCount
		}
		p, err := rollout.Devices(c.Context, s, r, offset, limit, outcome)
		if err != nil {
			return err
		}
		page = &p
	}
	if c.Bool("json") {
		if page != nil {
			return writeJSON(c.App.Writer, struct {
				rollout.Progress
				Devices rollout.Page `json:"devices"`
			}{r.Progress(), *page})
		}
		return writeJSON(c.App.Writer, r.Progress())
	}
	return printRollout(c.App.Writer, r, page)
}

func printRollout(w io.Writer, r *rollout.Rollout, page *rollout.Page) error {
	p := r.Progress()
	fmt.Fprintf(w, "rollout %s: %s%s\n", p.Name, p.State, reasonSuffix(p.Reason))
	fmt.Fprintf(w, "command %s %s", p.Spec.Command, string(p.Spec.Args))
	if p.Spec.Select != "" {
		fmt.Fprintf(w, " on %s", p.Spec.Select)
	}
	fmt.Fprintf(w, "\n%d devices: %d succeeded, %d failed (%.1f%%), %d running, %d queued, %d cancelled\n",
		p.Total.Total, p.Total.Succeeded, p.Total.Failures(), p.FailureRate, p.Total.Running, p.Total.Queued, p.Total.Cancelled)
	var rules []string
	for _, rule := range p.Spec.AbortWhen {
		rules = append(rules, rule.String())
	}
	if len(rules) > 0 {
		fmt.Fprintf(w, "abort when %s\n", strings.Join(rules, "; "))
	}
	if p.Spec.Rate.N > 0 {
		fmt.Fprintf(w, "rate %d/%s\n", p.Spec.Rate.N, time.Duration(p.Spec.Rate.Per))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tTARGET\tSIZE\tGATE\tSTATE\tSUCCEEDED\tFAILED\tRUNNING\tQUEUED\tFAILURE%")
	for _, wp := range p.Waves {
		fmt.Fprintf(tw, "%d\t%s (%d)\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%.1f\n", wp.Index+1, wp.Spec, wp.Target, wp.Size, wp.Gate, wp.State,
			wp.Counts.Succeeded, wp.Counts.Failures(), wp.Counts.Running, wp.Counts.Queued, wp.FailureRate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != nil {
		fmt.Fprintf(w, "next: wave %d, gate %s, %s%s\n", p.Next.Wave+1, p.Next.Gate, p.Next.State, reasonSuffix(p.Next.Reason))
	}
	if p.Rollback != nil {
		fmt.Fprintf(w, "rollback %s: %d rolled back, %d failed, %d running\n", p.Rollback.Command,
			p.RolledBack.Succeeded, p.RolledBack.Failures(), p.RolledBack.Running+p.RolledBack.Queued)
	}
	if page != nil {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DEVICE\tWAVE\tOUTCOME\tATTEMPT\tROLLBACK\tERROR")
		for _, e := range page.Devices {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", printable(e.Device), e.Wave+1, dash(string(e.Outcome)), e.Attempt, dash(string(e.Rollback)), printable(dash(e.Error)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if n := page.Offset + len(page.Devices); n < page.Total {
			fmt.Fprintf(w, "%d more: --offset %d\n", page.Total-n, n)
		}
	}
	for _, e := range p.Events {
		fmt.Fprintf(w, "%s  %-26s wave %d  %s\n", e.At.Format(time.RFC3339Nano), e.Type, e.Wave+1, e.Detail)
	}
	return nil
}

// registerRolloutMetrics adds each rollout's devices by outcome and its
// state (metrics.RolloutCollector) to reg, read from s while elected
// says so (always when nil).
func registerRolloutMetrics(reg *prometheus.Registry, s task.Store, elected func() bool) error {
	col, err := metrics.NewRolloutCollector(metrics.RolloutConfig{Logger: slog.Default(), Elected: elected,
		Counter: metrics.RolloutCounterFunc(func(ctx context.Context) ([]metrics.RolloutCount, error) {
			list, err := rollout.List(ctx, s)
			out := make([]metrics.RolloutCount, 0, len(list))
			for _, r := range list {
				rc := metrics.RolloutCount{Name: r.Name, State: string(r.State), Outcomes: map[string]int64{}}
				// The aggregates: no shard is read.
				total := r.Progress().Total
				for _, o := range metrics.RolloutOutcomes {
					if n := total.Of(rollout.Outcome(o)); n > 0 {
						rc.Outcomes[o] = int64(n)
					}
				}
				out = append(out, rc)
			}
			return out, err
		})})
	if err != nil {
		return err
	}
	return reg.Register(col)
}
