package main

// The inventory's operator commands beside `device label`: vouching for
// devices, forgetting them.

import (
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/mqttdev"
)

// approveCommand is `device approve`.
func approveCommand() *cli.Command {
	return &cli.Command{
		Name: "approve",
		Usage: "vouch for devices: a device is new, and no rollout selects it, until an operator approves it " +
			"or it is given a credential",
		ArgsUsage: "ID ... | --select k=v,...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "by", Value: "operator", Usage: "who vouches, as the inventory records it"},
			&cli.StringFlag{Name: "select", Usage: "approve every device whose operator labels match k=v,k!=v,... (at least one k=v term, no attr: term)"},
			&cli.BoolFlag{Name: "json", Usage: "print the inventory entries as JSON"},
		},
		Action: deviceApprove,
	}
}

// forgetCommand is `device forget`.
func forgetCommand() *cli.Command {
	return &cli.Command{
		Name: "forget",
		Usage: "remove devices' inventory entries (attributes, labels, vouching) and stored states; " +
			"a device that announces itself again comes back as new",
		ArgsUsage: "ID ...",
		Action:    deviceForget,
	}
}

func deviceForget(c *cli.Context) error {
	ids := c.Args().Slice()
	if len(ids) == 0 {
		return badUsage(c, "want at least one device ID")
	}
	for _, id := range ids {
		if err := mqttdev.ValidateID("device", id); err != nil {
			return err
		}
	}
	s, err := openStore(c, true)
	if err != nil {
		return err
	}
	defer s.Close()
	for _, id := range ids {
		if err := mqttdev.Forget(c.Context, s, id); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "%s forgotten: it comes back as new if it announces itself again\n", id)
	}
	return nil
}

func deviceApprove(c *cli.Context) error {
	ids := c.Args().Slice()
	var sel mqttdev.Selector
	switch {
	case c.IsSet("select") && len(ids) > 0:
		return badUsage(c, "give device IDs or --select, not both")
	case c.IsSet("select"):
		var err error
		if sel, err = mqttdev.ParseSelector(c.String("select")); err != nil {
			return badFlag(c, "select", "%v", err)
		}
		// Approving by what devices announce would let any device
		// approve itself.
		if attrs := sel.Attributes(); len(attrs) > 0 {
			return badFlag(c, "select", "term %q reads an attribute the device announced; approve by operator labels only", attrs[0].String())
		}
		// k!=v also matches a device without k, and a new device has no
		// labels: != terms alone would vouch for every device that ever
		// announced itself, through whatever broker.
		if !slices.ContainsFunc(sel, func(r mqttdev.Requirement) bool { return !r.Not }) {
			return badFlag(c, "select", "%q has no k=v term; != terms alone match every new device (it has no labels): name a label the devices carry", sel.String())
		}
	case len(ids) == 0:
		return badUsage(c, "want at least one device ID, or --select")
	}
	for _, id := range ids {
		if err := mqttdev.ValidateID("device", id); err != nil {
			return err
		}
	}
	if err := mqttdev.ValidateVouchedBy(c.String("by")); err != nil {
		return badFlag(c, "by", "%v", err)
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	if sel != nil {
		picked, err := mqttdev.Select(c.Context, s, sel)
		if err != nil {
			return err
		}
		if ids = picked.New; len(ids) == 0 {
			fmt.Fprintf(c.App.ErrWriter, "no new device matches %s (%d vouched for already)\n", sel, len(picked.Devices))
		}
	}
	var out []mqttdev.Inventory
	for _, id := range ids {
		inv, err := mqttdev.VouchAt(c.Context, s, id, c.String("by"), s.Now())
		if err != nil {
			return err
		}
		out = append(out, inv)
		if !c.Bool("json") {
			fmt.Fprintf(c.App.Writer, "%s vouched for by %s at %s\n", id, inv.Vouched.By, inv.Vouched.At.Format("2006-01-02T15:04:05Z07:00"))
		}
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, out)
	}
	return nil
}
