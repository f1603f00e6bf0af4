package main

// `leasepool trigger add|ls|rm|pause|resume`: a task per change of a
// MongoDB collection (package trigger); `leasepool worker` runs the
// trigger runner on the elected worker.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/trigger"
)

func triggerCommand() *cli.Command {
	return &cli.Command{
		Name:  "trigger",
		Usage: "a task per change of a MongoDB collection or of a table of the embedded store: the elected worker publishes one, keyed trigger:NAME:..., for every matching change",
		Subcommands: []*cli.Command{
			triggerAddCommand(),
			{
				Name: "ls", Usage: "list triggers with their position",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print a JSON array"}},
				Action: triggerList,
			},
			scheduleNameCommand("rm", "remove a trigger and its position (tasks already published stay)", func(c *cli.Context, s task.Store, name string) error {
				if err := trigger.Remove(c.Context, s, name); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed %s\n", name)
				return nil
			}),
			scheduleNameCommand("pause", "stop publishing a trigger's changes (its position stays)", func(c *cli.Context, s task.Store, name string) error {
				if _, err := trigger.Pause(c.Context, s, name); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "paused %s\n", name)
				return nil
			}),
			scheduleNameCommand("resume", "publish a paused trigger's changes again, from its position (changes made while paused publish too)",
				func(c *cli.Context, s task.Store, name string) error {
					if _, err := trigger.Resume(c.Context, s, name); err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "resumed %s\n", name)
					return nil
				}),
		},
	}
}

func triggerAddCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range taskFlags() {
		// The payload is the changed document.
		if n := f.Names()[0]; n != "payload" && n != "payload-file" {
			flags = append(flags, f)
		}
	}
	return &cli.Command{
		Name:      "add",
		Usage:     "add a trigger: a MongoDB collection (or a table of the embedded store), which of its changes, and the task each change publishes (its payload is the changed document or row)",
		ArgsUsage: "NAME",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "collection", Usage: "MongoDB: the collection watched, DB.COLL (it must exist; not one of leasepool's own)"},
			&cli.StringFlag{Name: "table", Usage: "the embedded store: the table of its file whose changes publish, through SQL triggers in the writer's own transaction (it must exist; not one of leasepool's own)"},
			&cli.StringFlag{Name: "filter", Usage: `MongoDB: a match expression on the changed document, in MongoDB extended JSON, such as '{"status": "new"}' (deletes carry no document: not filtered); ` +
				`a table: a JSON object of column values the new row (the old one, for a delete) must equal, such as '{"status": "new", "urgent": 1}'`},
			&cli.StringFlag{Name: "operations", DefaultText: strings.Join(trigger.DefaultOperations, ",") + "; a table: " + strings.Join(trigger.DefaultTableOperations, ","),
				Usage: "comma-separated kinds of change that publish: " + strings.Join(task.CollectionOperations, ", ") + " (a table: no replace)"},
			&cli.StringFlag{Name: "fields", Usage: "comma-separated fields (dotted paths) of the document that make the payload, with _id; a table: its columns", DefaultText: "the whole document or row"},
			&cli.StringFlag{Name: "version-field", Usage: "a field that changes with every write (a version, an updated-at): a rescan after lost history keys each document's task by _id and it",
				DefaultText: "a hash of the document"},
			&cli.BoolFlag{Name: "replace", Usage: "replace a trigger of that name (it keeps its position)"},
		}, flags...),
		Action: func(c *cli.Context) error {
			tr, err := triggerFromFlags(c)
			if err != nil {
				return &usageError{cmd: c.Command.HelpName, err: err}
			}
			kinds := []kindRef{{"--kind", tr.Kind}}
			if err := refuseKindsWithoutWorker(c, kinds); err != nil {
				return err
			}
			s, err := openStore(c, false)
			if err != nil {
				return err
			}
			defer s.Close()
			added, err := trigger.Add(c.Context, s, tr, c.Bool("replace"))
			if errors.Is(err, task.ErrInvalid) {
				return flagNamed(err) // the store's checks: the table, the filter's columns
			}
			if err != nil {
				return err
			}
			warnKindsWithoutWorker(c, s, kinds)
			on := added.Collection
			if added.Table != "" {
				on = "table " + added.Table
			}
			fmt.Fprintf(c.App.Writer, "added %s (%s on %s, from %s)\n", added.Name, strings.Join(added.Operations, ","), on,
				added.Since.Format(time.RFC3339))
			return nil
		},
	}
}

// triggerFromFlags reads and validates every flag of trigger add that
// needs no server.
func triggerFromFlags(c *cli.Context) (trigger.Trigger, error) {
	var tr trigger.Trigger
	if c.NArg() != 1 {
		return tr, badUsage(c, "want exactly one NAME argument, got %d", c.NArg())
	}
	tr.Name, tr.Collection, tr.Table, tr.VersionField = c.Args().First(), c.String("collection"), c.String("table"), c.String("version-field")
	switch {
	case c.IsSet("collection") && c.IsSet("table"):
		return tr, badFlag(c, "table", "give --collection (MongoDB) or --table (the embedded store), not both")
	case !c.IsSet("collection") && !c.IsSet("table"):
		return tr, badFlag(c, "collection", "required: DB.COLL, the collection watched (or --table TABLE on the embedded store)")
	case c.IsSet("table") && tr.Table == "":
		return tr, badFlag(c, "table", "must not be empty")
	}
	if c.IsSet("filter") {
		tr.Filter = json.RawMessage(c.String("filter"))
	}
	ops, err := listFlag(c, "operations")
	if err != nil {
		return tr, err
	}
	if c.IsSet("operations") && len(ops) == 0 {
		return tr, badFlag(c, "operations", "name at least one of %s", strings.Join(task.CollectionOperations, ", "))
	}
	tr.Operations = ops
	if tr.Fields, err = listFlag(c, "fields"); err != nil {
		return tr, err
	}
	if k := c.String("kind"); k == "exec" || k == mqttdev.Kind {
		// Their payload is a program or a device command, never a document.
		return tr, badFlag(c, "kind", "%s takes its payload from the publisher; a trigger's payload is the changed document", k)
	}
	p, err := taskParams(c, trigger.ChangeKey(tr.Name, nil), time.Time{})
	if err != nil {
		return tr, err
	}
	tr.Kind, tr.Options = p.Kind, p.Options
	check := tr
	if len(check.Operations) == 0 {
		check.Operations = trigger.DefaultOperations
		if tr.Table != "" {
			check.Operations = trigger.DefaultTableOperations
		}
	}
	if err := check.Validate(); err != nil {
		return tr, flagNamed(err)
	}
	return tr, nil
}

// flagNamed spells a trigger field as its flag.
func flagNamed(err error) error {
	msg := err.Error()
	for _, f := range []string{"collection", "table", "filter", "operations", "fields", "version_field", "name", "kind"} {
		if rest, ok := strings.CutPrefix(msg, task.ErrInvalid.Error()+": "+f); ok {
			flag := "--" + strings.ReplaceAll(f, "_", "-")
			if f == "name" {
				flag = "NAME"
			}
			return fmt.Errorf("%w: %s%s", task.ErrInvalid, flag, rest)
		}
	}
	return err
}

func triggerList(c *cli.Context) error {
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	list, err := trigger.List(c.Context, s)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		if list == nil {
			list = []trigger.Info{}
		}
		return writeJSON(c.App.Writer, list)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCOLLECTION\tOPERATIONS\tFILTER\tSTATE\tKIND\tPUBLISHED\tRESCANS\tPOSITION AT")
	for _, in := range list {
		state := "active"
		if in.Paused {
			state = "paused"
		}
		filter := "-"
		if len(in.Filter) > 0 {
			filter = string(in.Filter)
		}
		rescans := 0
		if in.Position.Rescan != nil {
			rescans = in.Position.Rescan.Count
		}
		on := in.Collection
		if in.Table != "" {
			on = "table " + in.Table
		}
		published, rescanned, at := strconv.FormatInt(in.Position.Published, 10), strconv.Itoa(rescans), stamp(in.Position.At)
		if in.Table != "" {
			// No position: what is not published waits in the outbox.
			published, rescanned, at = "-", "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", printable(in.Name), printable(on), strings.Join(in.Operations, ","),
			printable(filter), state, printable(in.Kind), published, rescanned, at)
	}
	return tw.Flush()
}
