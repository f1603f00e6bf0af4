package main

// `leasepool flow signal KEY STEP [--payload JSON]`: the signal a signal
// step waits for.

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

func flowSignalCommand() *cli.Command {
	return &cli.Command{
		Name: "signal", Usage: "send a signal step its signal; the payload becomes the step's result (a step takes one signal)",
		ArgsUsage: "KEY STEP",
		Flags:     []cli.Flag{&cli.StringFlag{Name: "payload", Usage: "a JSON value: the step's result (default null)"}},
		Action:    flowSignal,
	}
}

// flowSignal checks its input before it opens the store, so bad input
// writes nothing. A second signal, or one to a flow no longer pending or
// running, is refused (exit 1).
func flowSignal(c *cli.Context) error {
	if c.NArg() != 2 {
		return badUsage(c, "want KEY and STEP, got %d arguments", c.NArg())
	}
	key, step := c.Args().Get(0), c.Args().Get(1)
	var payload json.RawMessage
	if c.IsSet("payload") {
		payload = json.RawMessage(c.String("payload"))
		if err := task.ValidateJSON("payload", payload, task.MaxJSONDepth); err != nil {
			return err
		}
		if !json.Valid(payload) {
			return badFlag(c, "payload", "not valid JSON")
		}
	}
	s, err := openStore(c, true)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, err := publishContext(c)
	if err != nil {
		return err
	}
	f, err := flow.Signal(ctx, s, key, step, payload)
	if errors.Is(err, flow.ErrNotSignalStep) {
		return fmt.Errorf("%w: STEP: %w", task.ErrInvalid, err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "signalled %s %s: %s (%s)\n", f.Key, step, f.State, cursorText(f))
	return nil
}
