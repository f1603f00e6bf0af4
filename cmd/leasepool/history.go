package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// showStamp is how show prints a time: local, to the millisecond.
const showStamp = "2006-01-02 15:04:05.000"

// printAttempts prints every attempt t recorded, oldest first: worker,
// instance, state, start, end or lease, error, result and log lines.
func printAttempts(w io.Writer, t *task.Task) {
	all := t.AttemptHistory()
	if len(all) == 0 {
		return
	}
	head := fmt.Sprintf("\n%d attempt(s)", len(all))
	if t.HistoryDropped > 0 {
		head += fmt.Sprintf(" (and %d older, not kept)", t.HistoryDropped)
	}
	fmt.Fprintln(w, head+":")
	for _, a := range all {
		line := fmt.Sprintf("attempt %d  %s  %s", a.Attempt, printable(a.WorkerID), a.State)
		if a.Instance != "" {
			line += "  instance " + printable(a.Instance)
		}
		fmt.Fprintln(w, line)
		times := "  started " + a.StartedAt.Local().Format(showStamp)
		if !a.EndedAt.IsZero() {
			times += "  ended " + a.EndedAt.Local().Format(showStamp) + " (" + a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond).String() + ")"
		}
		times += "  lease until " + a.LeaseUntil.Local().Format(showStamp)
		fmt.Fprintln(w, times)
		if a.Error != "" {
			for i, l := range strings.Split(strings.TrimRight(a.Error, "\n"), "\n") {
				if i == 0 {
					fmt.Fprintln(w, "  error: "+printable(l))
				} else {
					fmt.Fprintln(w, "    "+printable(l))
				}
			}
		}
		if len(a.Result) > 0 {
			fmt.Fprintln(w, "  result: "+printable(string(a.Result)))
		}
		if a.OutputDropped {
			fmt.Fprintln(w, "  result and log not kept (history's size limit)")
		}
		if a.LogDropped > 0 {
			fmt.Fprintf(w, "  log: %d earlier line(s) not kept\n", a.LogDropped)
		}
		for _, l := range a.Log {
			fmt.Fprintf(w, "  log %s  %s\n", l.At.Local().Format(time.TimeOnly+".000"), printable(l.Msg))
		}
	}
}
