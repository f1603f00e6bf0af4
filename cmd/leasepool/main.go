// Command leasepool publishes, runs and inspects leasepool tasks. It only
// parses flags and wires library packages together.
package main

import (
	"context"
	"errors"
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
	// `leasepool __exec-guard PROGRAM ARGV...` (hidden): the guard the worker runs
	// each exec program under (builtin.ExecConfig.GuardPath).
	builtin.GuardMain()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	stopSuspending := suspendCleanly()
	code := run(ctx, os.Args, os.Stdin, os.Stdout, os.Stderr)
	stopSuspending()
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1 // the command failed: store unreachable, task not found...
	exitBadInput = 2 // a usage error or an invalid value: nothing was done
)

// run runs the CLI on args as main does and returns the exit status; an
// error is printed as one line on stderr.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	app.Reader = stdin
	err := app.RunContext(ctx, interspersed(app, args))
	if err == nil {
		return exitOK
	}
	msg := app.Name + ": " + oneLine(err)
	var ue *usageError
	if errors.As(err, &ue) {
		msg += "; see '" + ue.cmd + " --help'"
	}
	fmt.Fprintln(stderr, msg)
	return exitStatus(err)
}

// exitStatus is exitBadInput for usage errors and invalid values
// (task.ErrInvalid), exitFailed for any other error.
func exitStatus(err error) int {
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, task.ErrInvalid) {
		return exitBadInput
	}
	return exitFailed
}

// usageError is a command line that does not parse: an unknown command or
// flag, a value of the wrong type, a missing argument. It exits with
// exitBadInput and points at cmd's --help instead of printing it.
type usageError struct {
	cmd string // "leasepool publish"
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// badUsage returns a usageError of the command c runs.
func badUsage(c *cli.Context, format string, args ...any) error {
	return &usageError{cmd: c.Command.HelpName, err: fmt.Errorf(format, args...)}
}

// onUsageError replaces urfave/cli's "Incorrect Usage" and full help with
// one line naming the flag.
func onUsageError(c *cli.Context, err error, _ bool) error {
	// The flag package spells flags with one dash.
	msg := strings.Replace(err.Error(), "flag -", "flag --", 1)
	msg = strings.Replace(msg, "flag provided but not defined: -", "unknown flag --", 1)
	name := c.App.Name
	if c.Command != nil && c.Command.HelpName != "" {
		name = c.Command.HelpName
	}
	return &usageError{cmd: name, err: errors.New(msg)}
}

// setUsageErrors installs onUsageError on cmds and their subcommands.
func setUsageErrors(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if cmd.OnUsageError == nil {
			cmd.OnUsageError = onUsageError
		}
		setUsageErrors(cmd.Subcommands)
	}
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// newApp builds the CLI writing to stdout and stderr, so tests can run it.
func newApp(stdout, stderr io.Writer) *cli.App {
	var stopTracing func(context.Context) error
	app := &cli.App{
		Name:      "leasepool",
		Usage:     "a lease-based distributed task queue",
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "store", EnvVars: []string{"LEASEPOOL_STORE"}, Value: "sqlite:leasepool.db",
				Usage: "task store: sqlite:PATH or mongodb://..."},
			&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error", DefaultText: "info for worker, serve, device broker and device simulate; warn for the rest"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of this command here (go tool pprof)"},
		},
		Before: func(c *cli.Context) error {
			level := defaultLogLevel(c.App, c.Args().Slice())
			if c.IsSet("log-level") {
				if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
					return badUsage(c, "--log-level: %q is not one of debug, info, warn, error", c.String("log-level"))
				}
			}
			slog.SetDefault(newLogger(stderr, level))
			tuneGC()
			shutdown, err := startTracing(c)
			if err != nil {
				return err
			}
			stopTracing = shutdown
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
			if stopTracing != nil {
				// Spans not yet exported go now, within a bound: an
				// unreachable collector must not hold the exit.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := stopTracing(ctx); err != nil {
					slog.Warn("tracing: spans not exported at exit", slog.Any("err", err))
				}
			}
			return nil
		},
		Commands: []*cli.Command{
			publishCommand(), workerCommand(), workersCommand(), lsCommand(), showCommand(), cancelCommand(), retryCommand(),
			eventsCommand(),
			demoCommand(), benchCommand(), scheduleCommand(), triggerCommand(), retentionCommand(),
			pauseCommand(), resumeCommand(), pausesCommand(), limitCommand(), serveCommand(),
			deviceCommand(), devicesCommand(openStoreReadOnly), flowCommand(), rolloutCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // main prints the one-line error
		OnUsageError:   onUsageError,
		// Reached with arguments only when the first names no command.
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return &usageError{cmd: c.App.Name, err: fmt.Errorf("unknown command %q", c.Args().First())}
			}
			return cli.ShowAppHelp(c)
		},
	}
	setUsageErrors(app.Commands)
	setUnknownSubcommand(app.Commands)
	return app
}

// logsAtInfo are the commands that run until stopped: what they log at
// info (claims, connections, a device going away) is what they show.
var logsAtInfo = [][]string{{"worker"}, {"serve"}, {"device", "broker"}, {"device", "simulate"}}

// defaultLogLevel is the log level of the command args names when
// --log-level is not given: info for the commands of logsAtInfo, warn for
// any other. A one-shot command's output is its answer; an info line
// around it (a store's first open starting its clock epoch) is noise.
func defaultLogLevel(app *cli.App, args []string) slog.Level {
	var names []string
	if len(args) > 0 {
		for cmd := app.Command(args[0]); cmd != nil; {
			names = append(names, cmd.Name)
			if len(names) >= len(args) {
				break
			}
			cmd = subcommand(cmd, args[len(names)])
		}
	}
	for _, want := range logsAtInfo {
		if slices.Equal(names, want) {
			return slog.LevelInfo
		}
	}
	return slog.LevelWarn
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// setUnknownSubcommand makes a command with subcommands refuse one it does
// not have, as a usage error, instead of urfave/cli's "No help topic".
func setUnknownSubcommand(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if len(cmd.Subcommands) > 0 && cmd.Action == nil {
			cmd.Action = func(c *cli.Context) error {
				if c.NArg() > 0 {
					return badUsage(c, "unknown command %q", c.Args().First())
				}
				return cli.ShowSubcommandHelp(c)
			}
		}
		setUnknownSubcommand(cmd.Subcommands)
	}
}

// badFlag is an invalid value of flag name: a usage error naming it.
func badFlag(c *cli.Context, name, format string, args ...any) error {
	return badUsage(c, "--%s: "+format, append([]any{name}, args...)...)
}

// positiveDuration reads a duration flag that, when given, must be above zero.
func positiveDuration(c *cli.Context, name string) (time.Duration, error) {
	if !c.IsSet(name) {
		return 0, nil
	}
	d := c.Duration(name)
	if d <= 0 {
		return 0, badFlag(c, name, "must be a positive duration, got %s", d)
	}
	return d, nil
}

// listFlag reads a comma-separated list flag. Given, it must name at least
// one item and have no empty ones: "--pin ,,," would otherwise silently mean
// no pins at all.
func listFlag(c *cli.Context, name string) ([]string, error) {
	if !c.IsSet(name) {
		return nil, nil
	}
	v := c.String(name)
	var out []string
	for _, p := range strings.Split(v, ",") {
		// Only the blanks around a comma go: "dev\n" stays itself, for
		// the item's own check to refuse.
		p = strings.Trim(p, " ")
		if p == "" {
			return nil, badFlag(c, name, "%q has an empty item (want ID[,ID...])", v)
		}
		out = append(out, p)
	}
	return out, nil
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
	names := []string{args[i]}
	i++
	// A subcommand ("limit set KEY --rate 2/1s") is reordered as a command.
	for cmd != nil && len(cmd.Subcommands) > 0 && i < len(args) {
		sub := subcommand(cmd, args[i])
		if sub == nil {
			break
		}
		cmd = sub
		names = append(names, args[i])
		i++
	}
	// A command that only groups subcommands is left to urfave/cli; one
	// with an action of its own ("bench", beside "bench curve") is not.
	if cmd == nil || (len(cmd.Subcommands) > 0 && cmd.Action == nil) {
		return append(append(append([]string{args[0]}, global...), names...), args[i:]...)
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
	out := append(append([]string{args[0]}, global...), names...)
	out = append(out, flags...)
	return append(append(out, "--"), positional...)
}

func subcommand(cmd *cli.Command, name string) *cli.Command {
	for _, sub := range cmd.Subcommands {
		if sub.HasName(name) {
			return sub
		}
	}
	return nil
}

// minLevel passes on records at or above its level only.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}
