package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
)

// execFlags are the worker's flags for the exec kind: which programs it
// may run, what environment they get, how long they have to stop.
func execFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "exec-allow", EnvVars: []string{"LEASEPOOL_EXEC_ALLOW"},
			Usage: "comma-separated path patterns (path.Match, absolute: /usr/local/bin/*) of the only programs exec may run, " +
				"matched against argv[0] looked up in the program's PATH; any other is refused and never started (default any program)"},
		&cli.StringFlag{Name: "exec-env", EnvVars: []string{"LEASEPOOL_EXEC_ENV"},
			Usage: "comma-separated names of the worker's environment variables passed to exec programs besides " +
				"PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ, TMPDIR, TERM and SHELL (no others are, none of leasepool's secrets)"},
		&cli.DurationFlag{Name: "kill-grace", Value: builtin.DefaultKillGrace,
			Usage: "on shutdown, how long an exec program has between SIGTERM and SIGKILL (lease loss and cancel kill at once)"},
		// Hidden: for a race-enabled build under test, whose guards would
		// each start the race runtime (three times the CPU of a plain
		// build's start) for code that package builtin's tests cover.
		&cli.StringFlag{Name: "exec-guard", EnvVars: []string{"LEASEPOOL_EXEC_GUARD"}, Hidden: true,
			Usage: "the leasepool binary, of this version, that guards each exec program (default this one)"},
	}
}

// execConfig maps the exec flags to builtin.ExecConfig. When kinds names
// exec, its programs run under a guard: this binary (see main), or the one
// --exec-guard names.
func execConfig(c *cli.Context, kinds []string) (builtin.ExecConfig, error) {
	allow, err := listFlag(c, "exec-allow")
	if err != nil {
		return builtin.ExecConfig{}, err
	}
	passEnv, err := listFlag(c, "exec-env")
	if err != nil {
		return builtin.ExecConfig{}, err
	}
	if _, err := positiveDuration(c, "kill-grace"); err != nil {
		return builtin.ExecConfig{}, err
	}
	cfg := builtin.ExecConfig{KillGrace: c.Duration("kill-grace"), Allow: allow, PassEnv: passEnv}
	if slices.Contains(kinds, "exec") {
		cfg.GuardPath = c.String("exec-guard")
		if cfg.GuardPath != "" {
			return cfg, nil
		}
		if cfg.GuardPath, err = os.Executable(); err != nil {
			return builtin.ExecConfig{}, fmt.Errorf("exec guard: %w", err)
		}
	}
	return cfg, nil
}
