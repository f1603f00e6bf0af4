package main

// `leasepool flow show`: the flow page's picture as text.

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/flowgraph"
)

func flowShow(c *cli.Context) error {
	key, err := oneKey(c)
	if err != nil {
		return err
	}
	s, err := openStoreReadOnly(c)
	if err != nil {
		return err
	}
	defer s.Close()
	f, err := flow.Get(c.Context, s, key)
	if err != nil {
		return err
	}
	g := flowgraph.FromFlow(f, s.Now())
	if c.Bool("json") {
		// The stored document, with the picture's levels and rollback
		// order beside its fields.
		b, err := json.Marshal(f)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			return err
		}
		doc["graph"] = g.Summary()
		return writeJSON(c.App.Writer, doc)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "flow %s: %s, %s, run %d, updated %s\n", flowgraph.Clean(f.Key), f.State, flowgraph.Clean(cursorText(f)), f.Gen, stamp(f.UpdatedAt))
	if f.Error != "" {
		fmt.Fprintf(w, "error: %s\n", flowgraph.Clean(f.Error))
	}
	if err := g.Text(w, colourOut(w)); err != nil {
		return err
	}
	fmt.Fprintln(w, "params:")
	for _, k := range sortedKeys(f) {
		fmt.Fprintf(w, "  %s: %s\n", flowgraph.Clean(k), flowgraph.Clean(string(f.Params[k])))
	}
	if len(f.Events) > 0 {
		fmt.Fprintln(w, "events:")
		for _, e := range f.Events {
			fmt.Fprintf(w, "  %s  %s  %s  %s\n", stamp(e.At), e.Type, flowgraph.Clean(e.Step), flowgraph.Clean(e.Message))
		}
	}
	return nil
}

// colourOut reports whether w is a terminal that takes colours (NO_COLOR
// unset): off a terminal the text is plain.
func colourOut(w any) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd()) && os.Getenv("NO_COLOR") == ""
}
