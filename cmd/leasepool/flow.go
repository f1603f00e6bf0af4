package main

// `leasepool flow publish|show|ls|cancel|retry`: multi-step flows with
// rollback (package flow); `leasepool worker` runs their steps and the
// reconciler.

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

func flowCommand() *cli.Command {
	return &cli.Command{
		Name:  "flow",
		Usage: "multi-step flows: each step an ordinary task, rolled back in reverse when a step fails",
		Subcommands: []*cli.Command{
			{
				Name: "publish", Usage: "publish a flow from a JSON file (idempotent by KEY); see the README's Flows section",
				ArgsUsage: "KEY",
				Flags:     []cli.Flag{&cli.StringFlag{Name: "file", Usage: "the flow's JSON (- for stdin)", Required: true}, strictFlag()},
				Action:    flowPublish,
			},
			{
				Name: "show", Usage: "print a flow: state, its steps level by level (state, attempts, time, needs, rollback), the rollback order, shared parameters, events",
				ArgsUsage: "KEY",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the stored document as JSON, with the levels and rollback order under \"graph\""},
					&cli.BoolFlag{Name: "all", Usage: "a flow of more than 200 steps: print every step, not its levels with a page of each"},
					&cli.IntFlag{Name: "level", Usage: "a flow of more than 200 steps: print only this level (from 1)"},
					&cli.IntFlag{Name: "page", Value: 1, Usage: "a flow of more than 200 steps: the page of each level's steps to print, failing steps first"}},
				Action: flowShow,
			},
			{
				Name: "ls", Usage: "list flows in publish order",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "active", Usage: "only flows still moving (pending, running, rolling back)"},
					&cli.BoolFlag{Name: "json", Usage: "print a JSON array"},
				},
				Action: flowList,
			},
			{
				Name: "cancel", Usage: "stop a flow: its running step's task is cancelled; --rollback then undoes the started steps in reverse",
				ArgsUsage: "KEY",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "rollback", Usage: "roll back the started steps"}},
				Action: flowKeyAction(func(c *cli.Context, s task.Store, key string) (*flow.Flow, error) {
					return flow.Cancel(c.Context, s, key, c.Bool("rollback"))
				}),
			},
			flowSignalCommand(),
			{
				Name: "retry", Usage: "run a failed or cancelled flow again from the first step whose work does not stand",
				ArgsUsage: "KEY",
				Action: flowKeyAction(func(c *cli.Context, s task.Store, key string) (*flow.Flow, error) {
					return flow.Retry(c.Context, s, key)
				}),
			},
		},
	}
}

func oneKey(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", badUsage(c, "want exactly one KEY argument, got %d", c.NArg())
	}
	return c.Args().First(), nil
}

// flowPublish reads and validates the file before it opens the store, so
// bad input writes nothing.
func flowPublish(c *cli.Context) error {
	key, err := oneKey(c)
	if err != nil {
		return err
	}
	in := os.Stdin
	if name := c.String("file"); name != "-" {
		if in, err = os.Open(name); err != nil {
			return badFlag(c, "file", "%v", err)
		}
		defer in.Close()
	}
	spec, err := flow.ParseSpec(in)
	if err != nil {
		return err
	}
	if spec.Key == "" {
		spec.Key = key
	}
	if spec.Key != key {
		return fmt.Errorf("%w: key: the file says %q, the argument %q", task.ErrInvalid, spec.Key, key)
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	kinds, err := flowKinds(spec)
	if err != nil {
		return err
	}
	// Device steps become a device job sequence: one command per device
	// at a time, waiting in each device's line.
	if err := mqttdev.PrepareFlow(&spec); err != nil {
		return err
	}
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
	f, res, err := flow.Publish(ctx, s, spec)
	if err != nil {
		return err
	}
	warnKindsWithoutWorker(c, s, kinds)
	fmt.Fprintf(c.App.Writer, "%s %s (%s)\n", res, f.Key, f.State)
	return nil
}

// flowKinds checks the payload of each step and rollback of a built-in
// kind (as publish does; device commands are mqttdev.PrepareFlow's) and
// returns every action's kind with its field.
func flowKinds(spec flow.Spec) ([]kindRef, error) {
	var refs []kindRef
	check := func(field string, a flow.Action) error {
		refs = append(refs, kindRef{field + ".kind", a.Kind})
		if !slices.Contains(builtin.Kinds, a.Kind) {
			return nil
		}
		if err := builtin.Validate(a.Kind, a.Payload); err != nil {
			r := strings.TrimPrefix(err.Error(), task.ErrInvalid.Error()+": payload: ")
			return fmt.Errorf("%w: %s.payload: %s", task.ErrInvalid, field, r)
		}
		return nil
	}
	for i, st := range spec.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		if st.StepType() != flow.TypeTask {
			continue // a signal or sleep step runs no task of its own
		}
		if err := check(field, st.Action); err != nil {
			return nil, err
		}
		if st.Rollback != nil {
			if err := check(field+".rollback", *st.Rollback); err != nil {
				return nil, err
			}
		}
	}
	return refs, nil
}

// flowKeyAction runs fn on the flow its argument names and prints the
// flow's state.
func flowKeyAction(fn func(c *cli.Context, s task.Store, key string) (*flow.Flow, error)) cli.ActionFunc {
	return storeAction(oneKey, fn, func(w io.Writer, f *flow.Flow) {
		fmt.Fprintf(w, "%s: %s (%s)\n", f.Key, f.State, cursorText(f))
	})
}

func flowList(c *cli.Context) error {
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	list, err := flow.List(c.Context, s, flow.ListQuery{Active: c.Bool("active")})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		if list == nil {
			list = []*flow.Flow{}
		}
		return writeJSON(c.App.Writer, list)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tAT\tRUN\tUPDATED\tERROR")
	for _, f := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", f.Key, f.State, cursorText(f), f.Gen, stamp(f.UpdatedAt), f.Error)
	}
	return tw.Flush()
}

// cursorText names the steps running (or rolling back); in a flow that
// stopped, the steps that stopped it and how: whose work failed, whose
// rollback failed, or that a cancel stopped ("step 2/5 b failed"). The
// flow's cursor (the step started last) is no such step once a rollback
// ran, so it names none but in a flow still moving.
func cursorText(f *flow.Flow) string {
	if len(f.Steps) == 0 {
		return "-"
	}
	steps := func(match func(p flow.Progress) bool) []int {
		var out []int
		for i, p := range f.Progress {
			if i < len(f.Steps) && match(p) {
				out = append(out, i)
			}
		}
		return out
	}
	cancelled := func(p flow.Progress) bool {
		return p.Do.State == flow.RunCancelled || p.Undo.State == flow.RunCancelled
	}
	var at []int
	how := ""
	switch f.State {
	case flow.StateRollbackFailed:
		at, how = steps(func(p flow.Progress) bool { return p.Undo.State == flow.RunFailed }), "rollback failed"
	case flow.StateFailed:
		// A step that never started has its work recorded failed when a
		// step it needs failed: only those that ran failed.
		at, how = steps(func(p flow.Progress) bool { return p.Do.State == flow.RunFailed && !p.Do.StartedAt.IsZero() }), "failed"
		if len(at) == 0 { // a cancel with rollback
			at, how = steps(cancelled), "cancelled"
		}
	case flow.StateCancelled:
		at, how = steps(cancelled), "cancelled"
	default:
		at = steps(func(p flow.Progress) bool { return p.Do.State == flow.RunActive || p.Undo.State == flow.RunActive })
		if len(at) < 2 && f.Cursor >= 0 && f.Cursor < len(f.Steps) {
			at = []int{f.Cursor}
		}
	}
	var s string
	switch len(at) {
	case 0:
		return "-"
	case 1:
		s = fmt.Sprintf("step %d/%d %s", at[0]+1, len(f.Steps), f.Steps[at[0]].Name)
	default:
		const named = 3 // a fleet's hundred failures would not fit a column
		var names []string
		for _, i := range at[:min(len(at), named)] {
			names = append(names, f.Steps[i].Name)
		}
		if n := len(at) - named; n > 0 {
			names[named-1] += fmt.Sprintf(" and %d more", n)
		}
		s = fmt.Sprintf("steps %s of %d", strings.Join(names, ", "), len(f.Steps))
	}
	if how != "" {
		s += " " + how
	}
	return s
}

func sortedKeys(f *flow.Flow) []string {
	keys := make([]string, 0, len(f.Params))
	for k := range f.Params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
