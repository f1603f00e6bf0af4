package main

// The flow-control commands: pause, resume, pauses, limit set|ls|rm. They
// only parse flags and call package control.

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

func targetFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kind", Usage: "tasks of this kind"},
		&cli.StringFlag{Name: "lock", Usage: "tasks taking this lock key (device:ID for a device); a trailing * matches a prefix"},
		&cli.BoolFlag{Name: "all", Usage: "every task"},
	}
}

// pauseTarget reads exactly one of --kind, --lock, --all.
func pauseTarget(c *cli.Context) (control.Target, error) {
	var ts []control.Target
	if c.IsSet("kind") {
		ts = append(ts, control.Kind(c.String("kind")))
	}
	if c.IsSet("lock") {
		ts = append(ts, control.Lock(c.String("lock")))
	}
	if c.Bool("all") {
		ts = append(ts, control.All())
	}
	if len(ts) != 1 {
		return control.Target{}, badUsage(c, "give exactly one of --kind KIND, --lock KEY, --all")
	}
	return ts[0], ts[0].Validate()
}

func pauseCommand() *cli.Command {
	return &cli.Command{
		Name:  "pause",
		Usage: "stop every worker from starting tasks of a kind, a lock key, or all; running tasks finish",
		Flags: targetFlags(),
		Action: func(c *cli.Context) error {
			return setPause(c, true)
		},
	}
}

func resumeCommand() *cli.Command {
	return &cli.Command{
		Name:  "resume",
		Usage: "lift a pause (--all lifts only the pause of all); workers start its tasks at once",
		Flags: targetFlags(),
		Action: func(c *cli.Context) error {
			return setPause(c, false)
		},
	}
}

func setPause(c *cli.Context, pause bool) error {
	target, err := pauseTarget(c)
	if err != nil {
		return err
	}
	set, verb, already := control.Resume, "resumed", "was not paused"
	if pause {
		set, verb, already = control.Pause, "paused", "was already paused"
	}
	return withStore(c, false, func(s task.Store) error {
		changed, err := set(c.Context, s, target)
		if err != nil {
			return err
		}
		if changed {
			fmt.Fprintln(c.App.Writer, verb, target)
		} else {
			fmt.Fprintln(c.App.Writer, target, already)
		}
		return nil
	})
}

func pausesCommand() *cli.Command {
	return &cli.Command{
		Name:  "pauses",
		Usage: "list the pauses in force",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON, one array"}},
		Action: func(c *cli.Context) error {
			return printList(c, control.Pauses, "TARGET\tSINCE", func(p control.PauseInfo) string {
				return fmt.Sprintf("%s\t%s", p.Target, p.Since.Local().Format(time.DateTime))
			})
		},
	}
}

// withStore runs fn on the --store, closed after.
func withStore(c *cli.Context, mustExist bool, fn func(task.Store) error) error {
	s, err := openStore(c, mustExist)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

// printList reads a list from the --store and prints it as one JSON array
// (--json) or as a table: header, then a row per item.
func printList[T any](c *cli.Context, read func(context.Context, task.Store) ([]T, error), header string, row func(T) string) error {
	return withStore(c, true, func(s task.Store) error {
		items, err := read(c.Context, s)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			if items == nil {
				items = []T{}
			}
			return writeJSON(c.App.Writer, items)
		}
		tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for _, it := range items {
			fmt.Fprintln(tw, row(it))
		}
		return tw.Flush()
	})
}

// limitTarget reads the lock key argument, --kind or --group.
func limitTarget(c *cli.Context) (control.Target, error) {
	switch {
	case c.NArg() == 1 && !c.IsSet("kind") && !c.IsSet("group"):
		t := control.Lock(c.Args().First())
		return t, t.Validate()
	case c.NArg() == 0 && c.IsSet("kind") && !c.IsSet("group"):
		t := control.Kind(c.String("kind"))
		return t, t.Validate()
	case c.NArg() == 0 && c.IsSet("group") && !c.IsSet("kind"):
		t := control.Group(c.String("group"))
		if err := t.Validate(); err != nil {
			return t, badFlag(c, "group", "%v", err)
		}
		return t, nil
	}
	return control.Target{}, badUsage(c, "give one lock KEY (device:ID, or device:* for every device), --kind KIND or --group GROUP")
}

// limitParts reads --rate, --weight and --concurrency: at least one.
func limitParts(c *cli.Context, target control.Target) (control.Limit, error) {
	l := control.Limit{Target: target}
	if c.IsSet("rate") {
		n, per, err := control.ParseRate(c.String("rate"))
		if err != nil {
			return l, badFlag(c, "rate", "%v", err)
		}
		l.N, l.Per = n, per
	}
	if c.IsSet("weight") {
		if l.Weight = c.Int("weight"); l.Weight < 1 || l.Weight > control.MaxWeight {
			return l, badFlag(c, "weight", "must be 1 to %d, got %d", control.MaxWeight, l.Weight)
		}
		if target.Scope != control.ScopeGroup {
			return l, badFlag(c, "weight", "applies to a --group only")
		}
	}
	if c.IsSet("concurrency") {
		if l.Concurrency = c.Int("concurrency"); l.Concurrency < 1 || l.Concurrency > control.MaxConcurrency {
			return l, badFlag(c, "concurrency", "must be 1 to %d, got %d", control.MaxConcurrency, l.Concurrency)
		}
	}
	if !c.IsSet("rate") && !c.IsSet("weight") && !c.IsSet("concurrency") {
		return l, badUsage(c, "give --rate N/DURATION, --weight W or --concurrency N")
	}
	return l, l.Validate()
}

// limitRow is a limit's row in limit ls.
func limitRow(l control.Limit) string {
	weight, conc := "-", "-"
	if l.Weight > 0 {
		weight = fmt.Sprint(l.Weight)
	}
	if l.Concurrency > 0 {
		conc = fmt.Sprint(l.Concurrency)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s", l.Target, l, weight, conc)
}

func limitCommand() *cli.Command {
	kind := &cli.StringFlag{Name: "kind", Usage: "limit a kind instead of a lock key"}
	group := &cli.StringFlag{Name: "group", Usage: "limit a group (tenant) instead of a lock key"}
	return &cli.Command{
		Name:  "limit",
		Usage: "limits shared by every worker: starts per duration, tasks running at once, a group's weight",
		Subcommands: []*cli.Command{
			{
				Name:      "set",
				Usage:     "set a limit's parts (those not given stay as they are); device:* is the default of every device without its own",
				ArgsUsage: "KEY",
				Flags: []cli.Flag{kind, group,
					&cli.StringFlag{Name: "rate", Usage: "N/DURATION, e.g. 2/1s: at most N starts per duration"},
					&cli.IntFlag{Name: "weight", Usage: "a group's share of the workers against other groups, 1 to 1000; a group given none weighs 1"},
					&cli.IntFlag{Name: "concurrency", Usage: "at most N running at once, cluster-wide (each key of a pattern on its own)"},
				},
				Action: func(c *cli.Context) error {
					target, err := limitTarget(c)
					if err != nil {
						return err
					}
					l, err := limitParts(c, target)
					if err != nil {
						return err
					}
					return withStore(c, false, func(s task.Store) error {
						if err := control.SetLimit(c.Context, s, l); err != nil {
							return err
						}
						fmt.Fprintf(c.App.Writer, "limit %s: %s\n", target, limitRow(l))
						return nil
					})
				},
			},
			{
				Name:  "ls",
				Usage: "list the limits",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON, one array"}},
				Action: func(c *cli.Context) error {
					return printList(c, control.Limits, "TARGET\tRATE\tWEIGHT\tCONCURRENCY", limitRow)
				},
			},
			{
				Name:      "rm",
				Usage:     "remove a limit (every part)",
				ArgsUsage: "KEY",
				Flags:     []cli.Flag{kind, group},
				Action: func(c *cli.Context) error {
					target, err := limitTarget(c)
					if err != nil {
						return err
					}
					return withStore(c, false, func(s task.Store) error {
						removed, err := control.RemoveLimit(c.Context, s, target)
						if err != nil {
							return err
						}
						if removed {
							fmt.Fprintln(c.App.Writer, "removed limit", target)
						} else {
							fmt.Fprintln(c.App.Writer, "no limit on", target)
						}
						return nil
					})
				},
			},
		},
	}
}
