package main

// `leasepool retention show|set`: how long finished tasks are kept
// (package retention); every worker runs a retention.Runner.

import (
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

func retentionCommand() *cli.Command {
	return &cli.Command{
		Name:  "retention",
		Usage: "how long finished tasks are kept before retention deletes them",
		Subcommands: []*cli.Command{
			{
				Name: "show", Usage: "print the stored policy (the defaults when none is stored)",
				Action: func(c *cli.Context) error {
					return withPolicy(c, openStoreReadOnly, false, func(task.Store, *retention.Policy) error { return nil })
				},
			},
			{
				Name: "set", Usage: "store the policy every worker applies from its next run",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "succeeded", Usage: "keep succeeded tasks this long; -1 keeps them forever", DefaultText: "unchanged"},
					&cli.StringFlag{Name: "failed", Usage: "keep failed tasks this long; -1 keeps them forever", DefaultText: "unchanged"},
					&cli.StringFlag{Name: "cancelled", Usage: "keep cancelled tasks this long; -1 keeps them forever", DefaultText: "unchanged"},
					&cli.StringFlag{Name: "device-states", Usage: "keep the state of a device not seen for this long; -1 keeps it forever", DefaultText: "unchanged"},
				},
				Action: retentionSet,
			},
		},
	}
}

// retentionSet reads every flag before it opens the store, so bad input
// writes nothing, then changes the fields given.
func retentionSet(c *cli.Context) error {
	given := map[string]task.Duration{}
	for _, name := range []string{"succeeded", "failed", "cancelled", "device-states"} {
		if !c.IsSet(name) {
			continue
		}
		if c.String(name) == "-1" {
			given[name] = retention.Forever
			continue
		}
		d, err := time.ParseDuration(c.String(name))
		if err != nil || d <= 0 {
			return badFlag(c, name, "%q: want a positive duration (24h, 168h) or -1 to keep forever", c.String(name))
		}
		given[name] = task.Duration(d)
	}
	open := func(c *cli.Context) (task.Store, error) { return openStore(c, false) }
	return withPolicy(c, open, true, func(s task.Store, p *retention.Policy) error {
		fields := map[string]*task.Duration{"succeeded": &p.Succeeded, "failed": &p.Failed, "cancelled": &p.Cancelled, "device-states": &p.DeviceStates}
		for name, d := range given {
			*fields[name] = d
		}
		return retention.Set(c.Context, s, *p)
	})
}

// withPolicy opens the store, reads the policy, lets fn change it, and
// prints the result. With replace, a stored policy that does not decode
// reads as the defaults, for fn to replace.
func withPolicy(c *cli.Context, open func(*cli.Context) (task.Store, error), replace bool, fn func(task.Store, *retention.Policy) error) error {
	s, err := open(c)
	if err != nil {
		return err
	}
	defer s.Close()
	p, err := retention.Get(c.Context, s)
	if replace && errors.Is(err, task.ErrInvalid) {
		p, err = retention.DefaultPolicy, nil
	}
	if err != nil {
		return err
	}
	if err := fn(s, &p); err != nil {
		return err
	}
	printPolicy(c, p)
	return nil
}

func printPolicy(c *cli.Context, p retention.Policy) {
	spell := func(d task.Duration) string {
		if d == retention.Forever {
			return "forever"
		}
		return time.Duration(d).String()
	}
	devices := p.DeviceStates
	if devices == 0 {
		devices = retention.DefaultPolicy.DeviceStates
	}
	fmt.Fprintf(c.App.Writer, "succeeded %s, failed %s, cancelled %s, device states %s\n",
		spell(p.Succeeded), spell(p.Failed), spell(p.Cancelled), spell(devices))
}

// retentionEveryFlag is `leasepool worker --retention-every`.
func retentionEveryFlag() cli.Flag {
	return &cli.DurationFlag{Name: "retention-every", Value: retention.DefaultEvery,
		Usage: "how often the elected worker (one per store) deletes old finished tasks (see leasepool retention)",
		Action: func(c *cli.Context, every time.Duration) error {
			if every < schedule.MinEvery {
				return badFlag(c, "retention-every", "must be at least %s, got %s", schedule.MinEvery, every)
			}
			return nil
		}}
}
