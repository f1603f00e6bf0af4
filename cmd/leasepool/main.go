// Command leasepool publishes, runs and inspects leasepool tasks. It only
// parses flags and wires library packages together.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/task"
)

func main() {
	// `leasepool __exec-guard ARGV...` (hidden): the guard the worker runs
	// each exec program under (builtin.ExecConfig.GuardPath).
	builtin.GuardMain()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := newApp(os.Stdout, os.Stderr)
	if err := app.RunContext(ctx, interspersed(app, os.Args)); err != nil {
		fmt.Fprintln(os.Stderr, "leasepool: "+oneLine(err))
		os.Exit(1)
	}
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// newApp builds the CLI writing to stdout and stderr, so tests can run it.
func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:      "leasepool",
		Usage:     "a lease-based distributed task queue",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "store", EnvVars: []string{"LEASEPOOL_STORE"}, Value: "sqlite:leasepool.db",
				Usage: "task store: sqlite:PATH or mongodb://..."},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of this command here (go tool pprof)"},
		},
		Before: func(c *cli.Context) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
				return fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", c.String("log-level"))
			}
			slog.SetDefault(newLogger(stderr, level))
			if path := c.String("cpuprofile"); path != "" {
				f, err := os.Create(path)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpuprofile: %w", err)
				}
			}
			return nil
		},
		After: func(c *cli.Context) error {
			if c.String("cpuprofile") != "" {
				pprof.StopCPUProfile()
			}
			return nil
		},
		Commands: []*cli.Command{
			publishCommand(), workerCommand(), workersCommand(), lsCommand(), showCommand(), cancelCommand(), retryCommand(),
			demoCommand(), benchCommand(),
			deviceCommand(), devicesCommand(func(c *cli.Context) (task.Store, error) { return openStore(c, true) }),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // main prints the one-line error
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return err
		},
	}
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// positiveDuration reads a duration flag that, when given, must be above zero.
func positiveDuration(c *cli.Context, name string) (time.Duration, error) {
	if !c.IsSet(name) {
		return 0, nil
	}
	d := c.Duration(name)
	if d <= 0 {
		return 0, fmt.Errorf("--%s: must be a positive duration, got %s", name, d)
	}
	return d, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// interspersed reorders args for urfave/cli, which stops at the first
// argument that is not a flag and knows global flags only before the
// command: a command's positional arguments go after its flags ("publish
// KEY --kind noop"), and global flags given after the command move before
// it ("bench --store URL").
func interspersed(app *cli.App, args []string) []string {
	lookup := func(flags []cli.Flag, tok string) (cli.Flag, bool) {
		name, _, _ := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		for _, f := range flags {
			if slices.Contains(f.Names(), name) {
				return f, true
			}
		}
		return nil, false
	}
	takesValue := func(f cli.Flag, tok string) bool {
		_, isBool := f.(*cli.BoolFlag)
		return !isBool && !strings.Contains(tok, "=")
	}
	global := []string{}
	i := 1
	// Global flags come first, as they are.
	for i < len(args) && strings.HasPrefix(args[i], "-") {
		global = append(global, args[i])
		if f, ok := lookup(app.Flags, args[i]); ok && takesValue(f, args[i]) && i+1 < len(args) {
			global = append(global, args[i+1])
			i++
		}
		i++
	}
	if i >= len(args) {
		return append([]string{args[0]}, global...)
	}
	cmd := app.Command(args[i])
	name := args[i]
	i++
	if cmd == nil || len(cmd.Subcommands) > 0 {
		return append(append(append([]string{args[0]}, global...), name), args[i:]...)
	}
	var flags, positional []string
	for ; i < len(args); i++ {
		switch tok := args[i]; {
		case tok == "--":
			positional = append(positional, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(tok, "-") && tok != "-":
			dst := &flags
			f, ok := lookup(cmd.Flags, tok)
			if !ok {
				if f, ok = lookup(app.Flags, tok); ok {
					dst = &global
				}
			}
			*dst = append(*dst, tok)
			if ok && takesValue(f, tok) && i+1 < len(args) {
				*dst = append(*dst, args[i+1])
				i++
			}
		default:
			positional = append(positional, tok)
		}
	}
	out := append(append([]string{args[0]}, global...), name)
	out = append(out, flags...)
	return append(append(out, "--"), positional...)
}
