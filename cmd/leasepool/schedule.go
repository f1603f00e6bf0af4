package main

// `leasepool schedule add|ls|rm|pause|resume`: repeatable tasks (package
// schedule); `leasepool worker` runs the schedule runner.

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

func scheduleCommand() *cli.Command {
	return &cli.Command{
		Name:  "schedule",
		Usage: "repeatable tasks: every worker publishes each slot as one task, keyed sched:NAME:SLOT",
		Subcommands: []*cli.Command{
			scheduleAddCommand(),
			{
				Name: "ls", Usage: "list schedules with their last and next slot",
				Flags:  []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print a JSON array"}},
				Action: scheduleList,
			},
			scheduleNameCommand("rm", "remove a schedule (tasks already published stay)", func(c *cli.Context, s task.Store, name string) error {
				if err := schedule.Remove(c.Context, s, name); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "removed %s\n", name)
				return nil
			}),
			scheduleNameCommand("pause", "stop publishing a schedule's slots", func(c *cli.Context, s task.Store, name string) error {
				if _, err := schedule.Pause(c.Context, s, name); err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "paused %s\n", name)
				return nil
			}),
			scheduleNameCommand("resume", "publish a paused schedule's slots again, from now (slots passed while paused are not owed)",
				func(c *cli.Context, s task.Store, name string) error {
					sch, err := schedule.Resume(c.Context, s, name)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "resumed %s (since %s)\n", name, sch.Since.Format(time.RFC3339))
					return nil
				}),
		},
	}
}

func scheduleAddCommand() *cli.Command {
	return &cli.Command{
		Name:      "add",
		Usage:     "add a schedule: a cron expression or an interval, and the task each slot publishes",
		ArgsUsage: "NAME",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "cron", Usage: "cron expression: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly, @daily..."},
			&cli.DurationFlag{Name: "every", Usage: fmt.Sprintf("fixed interval (at least %s): multiples of it since --start, or since the Unix epoch", schedule.MinEvery)},
			&cli.StringFlag{Name: "tz", Usage: "IANA time zone of --cron (default UTC)"},
			&cli.TimestampFlag{Name: "start", Layout: time.RFC3339, Usage: "first possible slot (RFC 3339)"},
			&cli.TimestampFlag{Name: "end", Layout: time.RFC3339, Usage: "last possible slot (RFC 3339)"},
			&cli.StringFlag{Name: "catch-up", Value: schedule.DefaultCatchUp.String(),
				Usage: "slots missed while no worker ran: none, last (the latest one runs) or all:N (the latest N run)"},
			&cli.BoolFlag{Name: "replace", Usage: "replace a schedule of that name"},
		}, taskFlags()...),
		Action: func(c *cli.Context) error {
			sch, err := scheduleFromFlags(c)
			if err != nil {
				return &usageError{cmd: c.Command.HelpName, err: err}
			}
			kinds := []kindRef{{"--kind", sch.Template.Kind}}
			if err := refuseKindsWithoutWorker(c, kinds); err != nil {
				return err
			}
			s, err := openStore(c, false)
			if err != nil {
				return err
			}
			defer s.Close()
			added, err := schedule.Add(c.Context, s, sch, c.Bool("replace"))
			if err != nil {
				return err
			}
			warnKindsWithoutWorker(c, s, kinds)
			fmt.Fprintf(c.App.Writer, "added %s (%s)\n", added.Name, when(added))
			return nil
		},
	}
}

// scheduleFromFlags reads and validates every flag of schedule add.
func scheduleFromFlags(c *cli.Context) (schedule.Schedule, error) {
	var sch schedule.Schedule
	if c.NArg() != 1 {
		return sch, badUsage(c, "want exactly one NAME argument, got %d", c.NArg())
	}
	sch.Name, sch.Cron, sch.TZ = c.Args().First(), c.String("cron"), c.String("tz")
	sch.Every = task.Duration(c.Duration("every"))
	if t := c.Timestamp("start"); t != nil {
		sch.Start = t.UTC()
	}
	if t := c.Timestamp("end"); t != nil {
		sch.End = t.UTC()
	}
	var err error
	if sch.CatchUp, err = schedule.ParseCatchUp(c.String("catch-up")); err != nil {
		return sch, err
	}
	p, err := taskParams(c, schedule.Key(sch.Name, time.Unix(0, 0)), time.Time{})
	if err != nil {
		return sch, err
	}
	sch.Template = schedule.NewTemplate(p.Kind, p.Payload, p.Options)
	return sch, sch.Validate()
}

func scheduleNameCommand(name, usage string, fn func(c *cli.Context, s task.Store, name string) error) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: "NAME",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return badUsage(c, "want exactly one NAME argument, got %d", c.NArg())
			}
			s, err := openStore(c, true)
			if err != nil {
				return err
			}
			defer s.Close()
			return fn(c, s, c.Args().First())
		},
	}
}

func scheduleList(c *cli.Context) error {
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	list, err := schedule.List(c.Context, s)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		if list == nil {
			list = []schedule.Info{}
		}
		return writeJSON(c.App.Writer, list)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tWHEN\tCATCH-UP\tSTATE\tKIND\tLAST SLOT\tNEXT SLOT")
	for _, in := range list {
		state := "active"
		if in.Paused {
			state = "paused"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Name, when(&in.Schedule), in.CatchUp, state, in.Template.Kind,
			stamp(in.LastSlot), stamp(in.NextSlot))
	}
	return tw.Flush()
}

// when spells a schedule's timing in a line.
func when(s *schedule.Schedule) string {
	w := "cron " + s.Cron
	if s.Every != 0 {
		w = "every " + time.Duration(s.Every).String()
	} else if s.TZ != "" {
		w += " " + s.TZ
	}
	if !s.Start.IsZero() {
		w += " from " + s.Start.Format(time.RFC3339)
	}
	if !s.End.IsZero() {
		w += " until " + s.End.Format(time.RFC3339)
	}
	return w
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
