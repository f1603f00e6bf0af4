package builtin_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
)

// TestRegisterLeavesExecOut: Register never registers exec; RegisterExec
// does, and refuses a bad configuration.
func TestRegisterLeavesExecOut(t *testing.T) {
	t.Parallel()
	m := consumer.NewMux()
	builtin.Register(m)
	kinds := m.Kinds()
	slices.Sort(kinds)
	if !slices.Equal(kinds, builtin.DefaultKinds) {
		t.Fatalf("Register registered %v, want %v", kinds, builtin.DefaultKinds)
	}
	job := execJob(t, builtin.ExecPayload{Argv: []string{"true"}})
	if err := m.Handle(t.Context(), job); !errors.Is(err, consumer.ErrUnknownKind) {
		t.Errorf("exec on a mux from Register = %v, want ErrUnknownKind", err)
	}
	if err := builtin.RegisterExec(m, builtin.ExecConfig{}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(m.Kinds(), "exec") {
		t.Errorf("RegisterExec did not register exec: %v", m.Kinds())
	}
	for _, cfg := range []struct {
		cfg  builtin.ExecConfig
		want string
	}{
		{builtin.ExecConfig{KillGrace: -1}, "KillGrace"},
		{builtin.ExecConfig{Allow: []string{"bin/*"}}, `Allow: pattern "bin/*" must be an absolute path`},
		{builtin.ExecConfig{Allow: []string{"*"}}, `Allow: pattern "*" must be an absolute path`},
		{builtin.ExecConfig{Allow: []string{"/usr/bin/[a-"}}, "Allow: pattern"},
		{builtin.ExecConfig{PassEnv: []string{"A=B"}}, "PassEnv"},
		{builtin.ExecConfig{PassEnv: []string{""}}, "PassEnv"},
	} {
		if err := builtin.RegisterExec(consumer.NewMux(), cfg.cfg); err == nil || !strings.Contains(err.Error(), cfg.want) {
			t.Errorf("RegisterExec(%+v) = %v, want an error saying %q", cfg.cfg, err, cfg.want)
		}
	}
}

// execHandlers are the direct and the guarded exec handler for cfg.
func execHandlers(t *testing.T, cfg builtin.ExecConfig) map[string]consumer.HandlerFunc {
	t.Helper()
	direct, err := builtin.NewExec(cfg)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.GuardPath = self
	guarded, err := builtin.NewExec(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]consumer.HandlerFunc{"direct": direct, "guarded": guarded}
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	p, err = filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestExecAllowRefuses: a program the allow-list does not match, however
// it is named, fails the attempt with an error naming it and the flag, and
// never starts (its marker file is never made).
func TestExecAllowRefuses(t *testing.T) {
	t.Parallel()
	sh := lookPath(t, "sh")
	touch := lookPath(t, "touch")
	dir := t.TempDir()
	// A directory of impostors: an "sh" and a "touch" that would run.
	evil := filepath.Join(dir, "evil")
	if err := os.Mkdir(evil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sh", "touch"} {
		if err := os.WriteFile(filepath.Join(evil, n), []byte("#!"+sh+"\n: > \"$MARK\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Only touch, where the worker's PATH finds it.
	hs := execHandlers(t, builtin.ExecConfig{Allow: []string{touch}})
	rel, err := filepath.Rel(dir, sh)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range hs {
		for _, c := range []struct {
			name    string
			p       builtin.ExecPayload
			refused string // the program the error names
			say     string // else: what the error says
		}{
			{"a shell by name", builtin.ExecPayload{Argv: []string{"sh", "-c", `: > "$MARK"`}}, sh, ""},
			{"a shell by path", builtin.ExecPayload{Argv: []string{sh, "-c", `: > "$MARK"`}}, sh, ""},
			{"dot-dot out of the allowed name", builtin.ExecPayload{Argv: []string{touch + "/../sh", "-c", `: > "$MARK"`}}, sh, ""},
			{"relative to dir", builtin.ExecPayload{Argv: []string{rel, "-c", `: > "$MARK"`}, Dir: dir}, sh, ""},
			{"payload PATH finds an impostor", builtin.ExecPayload{Argv: []string{"touch", "x"}, Env: map[string]string{"PATH": evil}}, filepath.Join(evil, "touch"), ""},
			{"impostor by relative path", builtin.ExecPayload{Argv: []string{"./evil/touch", "x"}, Dir: dir}, filepath.Join(evil, "touch"), ""},
			{"loader variable", builtin.ExecPayload{Argv: []string{"touch", "x"}, Env: map[string]string{"LD_PRELOAD": filepath.Join(evil, "x.so")}}, "", `env: "LD_PRELOAD" is not allowed with --exec-allow`},
		} {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				mark := filepath.Join(t.TempDir(), "ran")
				if c.p.Env == nil {
					c.p.Env = map[string]string{}
				}
				c.p.Env["MARK"] = mark
				err := h(t.Context(), execJob(t, c.p))
				if _, serr := os.Stat(mark); serr == nil {
					t.Fatal("the refused program ran: its marker exists")
				}
				if c.refused == "" {
					if err == nil || !strings.Contains(err.Error(), c.say) {
						t.Fatalf("error %v, want it to say %q", err, c.say)
					}
					return
				}
				var na *builtin.NotAllowedError
				if !errors.As(err, &na) || !errors.Is(err, builtin.ErrNotAllowed) || na.Program != c.refused {
					t.Fatalf("error %v, want a NotAllowedError for %s", err, c.refused)
				}
				if want := `exec: program "` + c.refused + `" is not allowed by --exec-allow`; err.Error() != want {
					t.Errorf("error %q, want %q", err, want)
				}
			})
		}
		// The allowed program runs, by name and by path, with its argv[0].
		t.Run(name+"/allowed", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "made")
			for _, argv0 := range []string{"touch", touch} {
				if err := h(t.Context(), execJob(t, builtin.ExecPayload{Argv: []string{argv0, out}})); err != nil {
					t.Fatalf("allowed %s: %v", argv0, err)
				}
				if _, err := os.Stat(out); err != nil {
					t.Fatalf("allowed %s did not run: %v", argv0, err)
				}
				os.Remove(out)
			}
		})
	}
	// A pattern allows a directory; argv[0] stays what the payload said.
	h, err := builtin.NewExec(builtin.ExecConfig{Allow: []string{filepath.Dir(sh) + "/*"}})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "argv0")
	if err := h(t.Context(), execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", `printf %s "$0" > "$OUT"`}, Env: map[string]string{"OUT": out}})); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); string(b) != "sh" {
		t.Errorf("argv[0] = %q, want sh", b)
	}
}

// TestExecEnvironmentHoldsNoSecrets: with leasepool's credentials and a
// cloud key in the worker's environment, a program sees none of them,
// only the minimal set, the payload's env and leasepool's task variables;
// PassEnv passes the one it names. Not parallel: it sets the process's
// environment.
func TestExecEnvironmentHoldsNoSecrets(t *testing.T) {
	secrets := map[string]string{
		"LEASEPOOL_TOKEN":         "tok-3b9f0e",
		"LEASEPOOL_STORE":         "mongodb://u:storepw-77a1@h/db",
		"LEASEPOOL_MQTT_PASSWORD": "mqttpw-6e8b3d",
		"LEASEPOOL_BASIC_AUTH":    "admin:basic-5d2e7a",
		"AWS_SECRET_ACCESS_KEY":   "aws-secret-2f7c9e",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	t.Setenv("LC_TIME", "C")
	t.Setenv("TZ", "UTC")
	run := func(h consumer.HandlerFunc) map[string]string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "env")
		job := execJob(t, builtin.ExecPayload{Argv: []string{"sh", "-c", `env > "$OUT"`}, Env: map[string]string{"OUT": out, "FROM_PAYLOAD": "p1"}})
		if err := h(t.Context(), job); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				env[k] = v
			}
		}
		return env
	}
	check := func(name string, env map[string]string, passed string) {
		t.Helper()
		for k, v := range secrets {
			got, has := env[k]
			if k == passed {
				if got != v {
					t.Errorf("%s: %s = %q, want it passed", name, k, got)
				}
				continue
			}
			if has {
				t.Errorf("%s: the program's environment holds %s", name, k)
			}
			for ek, ev := range env {
				if strings.Contains(ev, v) {
					t.Errorf("%s: %s holds the value of %s", name, ek, k)
				}
			}
		}
		for k, want := range map[string]string{"PATH": os.Getenv("PATH"), "LC_TIME": "C", "TZ": "UTC", "FROM_PAYLOAD": "p1", "LEASEPOOL_TASK_KEY": "tasks/42", "LEASEPOOL_ATTEMPT": "7", "LEASEPOOL_WORKER_ID": "worker-a"} {
			if env[k] != want {
				t.Errorf("%s: %s = %q, want %q", name, k, env[k], want)
			}
		}
		for k := range env {
			if !allowedName(k, passed) {
				t.Errorf("%s: the program's environment holds %s, outside the minimal set", name, k)
			}
		}
	}
	for name, h := range execHandlers(t, builtin.ExecConfig{}) {
		check(name, run(h), "")
	}
	check("Exec", run(builtin.Exec), "")
	for name, h := range execHandlers(t, builtin.ExecConfig{PassEnv: []string{"AWS_SECRET_ACCESS_KEY"}}) {
		check(name+" with PassEnv", run(h), "AWS_SECRET_ACCESS_KEY")
	}
}

// allowedName: what a program may see with PassEnv naming passed. The
// shell adds PWD, SHLVL and _ itself.
func allowedName(k, passed string) bool {
	switch {
	case k == passed, strings.HasPrefix(k, "LC_"), strings.HasPrefix(k, "LEASEPOOL_TASK_"),
		slices.Contains(builtin.MinimalEnv, k), slices.Contains([]string{"PWD", "SHLVL", "_", "OUT", "FROM_PAYLOAD"}, k):
		return true
	}
	return slices.Contains([]string{"LEASEPOOL_ATTEMPT", "LEASEPOOL_WORKER_ID", "LEASEPOOL_LEASE_DEADLINE"}, k)
}

// TestExecAllowRefusesCodeInEnv: with an allow-list, a payload cannot make
// an allowed script run code of its own through its environment: bash
// imports a function named by BASH_FUNC_cat%% and runs it for `cat`, and
// the other variables shells and interpreters load code from are refused
// as LD_PRELOAD is. The script runs normally without them.
func TestExecAllowRefusesCodeInEnv(t *testing.T) {
	t.Parallel()
	bash := lookPath(t, "bash")
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("#!"+bash+"\necho job | cat > \"$OUT\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, h := range execHandlers(t, builtin.ExecConfig{Allow: []string{dir + "/*"}}) {
		for _, v := range []struct{ name, value string }{
			{"BASH_FUNC_cat%%", `() { echo pwned > "$MARK"; }`},
			{"BASH_ENV", "/dev/null"},
			{"SHELLOPTS", "xtrace"},
			{"PS4", `$(echo pwned > "$MARK")`},
			{"PERL5OPT", "-Mbase;print(`id`)"},
			{"PYTHONPATH", dir},
			{"NODE_OPTIONS", "--require /proc/self/environ"},
			{"RUBYOPT", "-rx"},
			{"DYLD_INSERT_LIBRARIES", "x.dylib"},
		} {
			t.Run(name+"/"+v.name, func(t *testing.T) {
				mark, out := filepath.Join(t.TempDir(), "pwned"), filepath.Join(t.TempDir(), "out")
				err := h(t.Context(), execJob(t, builtin.ExecPayload{Argv: []string{script},
					Env: map[string]string{v.name: v.value, "MARK": mark, "OUT": out}}))
				if _, serr := os.Stat(mark); serr == nil {
					t.Fatal("the payload's code ran: its marker exists")
				}
				if _, serr := os.Stat(out); serr == nil {
					t.Fatal("the script started")
				}
				if want := `env: "` + v.name + `" is not allowed with --exec-allow`; err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want it to say %q", err, want)
				}
			})
		}
		t.Run(name+"/plain", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			if err := h(t.Context(), execJob(t, builtin.ExecPayload{Argv: []string{script}, Env: map[string]string{"OUT": out, "LANGUAGE": "C"}})); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(out); string(b) != "job\n" {
				t.Fatalf("the script wrote %q, want job", b)
			}
		})
	}
	// Without an allow-list any program runs anyway: the variables pass.
	h, err := builtin.NewExec(builtin.ExecConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if err := h(t.Context(), execJob(t, builtin.ExecPayload{Argv: []string{script}, Env: map[string]string{"OUT": out, "PYTHONPATH": dir}})); err != nil {
		t.Fatalf("without an allow-list: %v", err)
	}
}
