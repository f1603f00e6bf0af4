package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/task"
)

func workersCommand() *cli.Command {
	return &cli.Command{
		Name:  "workers",
		Usage: "list the worker registry: every worker process, live or lapsed, with its host, pid, kinds and running tasks",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON, one array"},
		},
		Action: func(c *cli.Context) error {
			s, err := openStore(c, true)
			if err != nil {
				return err
			}
			defer s.Close()
			ws, err := s.Workers(c.Context)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if ws == nil {
					ws = []task.WorkerInfo{}
				}
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(ws)
			}
			return printWorkers(c.App.Writer, ws, s.Now())
		},
	}
}

func printWorkers(w io.Writer, ws []task.WorkerInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tSTATUS\tHOST\tPID\tRUNNING\tCONCURRENCY\tKINDS\tHEARTBEAT\tSTARTED")
	for _, x := range ws {
		status := "live"
		if !x.Live(now) {
			status = "lapsed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s ago\t%s\n", x.ID, status, x.Host, x.PID, x.Running, x.Concurrency,
			strings.Join(x.Kinds, ","), now.Sub(x.Heartbeat).Round(time.Millisecond), x.StartedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}
