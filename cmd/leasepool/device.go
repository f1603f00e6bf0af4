package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/worker"
)

// mqttFlags are the broker flags shared by the device commands.
func mqttFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "mqtt", EnvVars: []string{"LEASEPOOL_MQTT_URL"}, Value: "tcp://127.0.0.1:1883", Usage: "MQTT broker URL"},
		&cli.StringFlag{Name: "mqtt-user", EnvVars: []string{"LEASEPOOL_MQTT_USER"}, Usage: "MQTT user name"},
		&cli.StringFlag{Name: "mqtt-password", EnvVars: []string{"LEASEPOOL_MQTT_PASSWORD"}, Usage: "MQTT password"},
		&cli.StringFlag{Name: "prefix", Value: mqttdev.DefaultPrefix, Usage: "first MQTT topic level"},
	}
}

func deviceCommand() *cli.Command {
	return &cli.Command{
		Name:  "device",
		Usage: "MQTT device tools: credentials, labels, a device simulator and an embedded broker",
		Subcommands: append(deviceCredentialCommands(),
			&cli.Command{
				Name:      "label",
				Usage:     "set (k=v) or remove (k-) a device's operator labels in the inventory, kept apart from what the device announces",
				ArgsUsage: "ID k=v|k- ...",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the inventory entry as JSON"}},
				Action:    deviceLabel,
			},
			approveCommand(), forgetCommand(),
			&cli.Command{
				Name:  "simulate",
				Usage: "run simulated devices until interrupted (or --duration), then print what they saw",
				Flags: append(mqttFlags(),
					&cli.IntFlag{Name: "count", Value: 1, Usage: "number of devices (one connection each: ten thousand fit in one process where the open files limit allows)"},
					&cli.StringFlag{Name: "id-prefix", Value: "dev-", Usage: "device ids are this prefix and an index"},
					&cli.IntFlag{Name: "first", Usage: "index of the first device, to split a fleet across simulator processes"},
					&cli.DurationFlag{Name: "latency", Usage: "how long each command runs"},
					&cli.Float64Flag{Name: "fail-rate", Usage: "probability that a command fails, in [0,1]"},
					&cli.Float64Flag{Name: "offline-rate", Usage: "probability that a device drops offline after a command, in [0,1]"},
					&cli.DurationFlag{Name: "offline-for", Value: 3 * time.Second, Usage: "how long an outage lasts"},
					&cli.Float64Flag{Name: "drop-ack-rate", Usage: "probability that a device sends no ack, in [0,1]"},
					&cli.DurationFlag{Name: "heartbeat", Value: 5 * time.Second, Usage: "online status period"},
					&cli.Int64Flag{Name: "seed", Value: 1, Usage: "random seed"},
					&cli.StringSliceFlag{Name: "attr", Usage: "an attribute every device announces, k=v; k=v1|v2|... gives device i the value i modulo their count (repeatable)"},
					&cli.IntFlag{Name: "fail-every", Usage: "every Nth device (index N-1, 2N-1, ...) fails every command"},
					&cli.StringSliceFlag{Name: "succeed", Usage: "a command that succeeds even on a --fail-every device, such as a rollback (repeatable)"},
					&cli.IntFlag{Name: "offline-every", Usage: "every Nth device (index 0, N, 2N, ...) announces itself, then stays offline"},
					&cli.IntFlag{Name: "slow-every", Usage: "every Nth device (index 1, N+1, ...) runs commands in --slow-latency"},
					&cli.DurationFlag{Name: "slow-latency", Value: 2 * time.Second, Usage: "how long a slow device's commands run"},
					&cli.IntFlag{Name: "outage-every", Usage: "every Nth device (index 0, N, 2N, ...) goes away once, all at once, --outage-after the start, for --outage-for"},
					&cli.DurationFlag{Name: "outage-after", Value: 5 * time.Second, Usage: "when the --outage-every outage begins, after the devices are up"},
					&cli.DurationFlag{Name: "outage-for", Value: 30 * time.Second, Usage: "how long the --outage-every outage lasts"},
					&cli.DurationFlag{Name: "outage-spread", Usage: "spread the returns of the --outage-every devices evenly over this long after --outage-for"},
					&cli.DurationFlag{Name: "duration", Usage: "stop this long after every device is up", DefaultText: "until interrupted"},
					&cli.DurationFlag{Name: "start-timeout", Value: 2 * time.Minute, Usage: "give up when the devices are not all up (connected and subscribed) within this long"},
					&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
					&cli.StringFlag{Name: "credentials", Usage: "file of ID:SECRET lines, the devices' own credentials; without it, --store (when given) gets a new credential for each device"},
				),
				Action: func(c *cli.Context) error {
					warnSecretFlag(c, "mqtt", "LEASEPOOL_MQTT_URL", true)
					warnSecretFlag(c, "mqtt-password", "LEASEPOOL_MQTT_PASSWORD", false)
					cfg, err := simConfig(c)
					if err != nil {
						return err
					}
					progress := c.App.Writer
					if c.Bool("json") {
						progress = c.App.ErrWriter
					}
					ids := make([]string, cfg.Count)
					for i := range ids {
						ids[i] = cfg.IDPrefix + strconv.Itoa(cfg.First+i)
					}
					if cfg.Secrets, err = simSecrets(c, ids, progress); err != nil {
						return err
					}
					r, err := device.RunSimulator(c.Context, cfg, device.RunOptions{Duration: c.Duration("duration"), StartTimeout: c.Duration("start-timeout")}, progress)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return writeJSON(c.App.Writer, r)
					}
					if len(r.Overlaps) > 0 {
						return fmt.Errorf("%d overlapping commands: one device ran two commands at once", len(r.Overlaps))
					}
					return nil
				},
			},
			&cli.Command{
				Name: "broker",
				Usage: "run an embedded MQTT broker on a loopback address until interrupted; " +
					"it lets in the devices and workers with a credential in --store",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "listen", Value: "127.0.0.1:1883", Usage: "loopback address to listen on"},
					&cli.BoolFlag{Name: "mqtt-anonymous", Usage: "let every client in, with every right, with no credential (a lab only: anyone who reaches the broker can pose as any device)"},
					&cli.StringFlag{Name: "tls-cert", Usage: "serve TLS with this certificate (PEM)"},
					&cli.StringFlag{Name: "tls-key", Usage: "the key of --tls-cert (PEM)"},
					&cli.StringFlag{Name: "client-ca", Usage: "require client certificates signed by this CA (PEM): the common name is the device id (which must have a credential) or worker:<id>, in place of a password"},
				},
				Action: deviceBroker,
			},
		),
	}
}

// deviceBroker runs `device broker`: checking the credentials of --store,
// or letting everyone in with --mqtt-anonymous.
func deviceBroker(c *cli.Context) error {
	cfg := broker.Config{Addr: c.String("listen"), Logger: slog.Default(), Anonymous: c.Bool("mqtt-anonymous")}
	tc, err := brokerTLS(c)
	if err != nil {
		return err
	}
	cfg.TLS = tc
	if !cfg.Anonymous {
		// A store made here would hold no credential: it must exist.
		s, err := openStore(c, true)
		if err != nil {
			return fmt.Errorf("%w (the broker checks the device credentials in the store: `leasepool device add` makes them; --mqtt-anonymous lets everyone in)", err)
		}
		defer s.Close()
		cfg.Credentials = credential.Source(s)
	}
	b, err := broker.Listen(c.Context, cfg)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer b.Close()
	fmt.Fprintf(c.App.Writer, "broker listening on %s\n", b.URL())
	<-c.Context.Done()
	return nil
}

// brokerTLS reads --tls-cert, --tls-key and --client-ca: nil for plain
// TCP.
func brokerTLS(c *cli.Context) (*tls.Config, error) {
	cert, key, ca := c.String("tls-cert"), c.String("tls-key"), c.String("client-ca")
	if cert == "" && key == "" {
		if ca != "" {
			return nil, badFlag(c, "client-ca", "needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	if cert == "" || key == "" {
		return nil, badFlag(c, "tls-cert", "--tls-cert and --tls-key go together")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca: %s holds no PEM certificate", ca)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// deviceFlags are the worker's flags for device tasks: how to reach the
// MQTT broker, or host the embedded one.
func deviceFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "mqtt", EnvVars: []string{"LEASEPOOL_MQTT_URL"},
			Usage: "MQTT broker for device tasks (tcp://, ssl://); empty: use the embedded broker at --embedded-broker, starting it if no other worker has"},
		&cli.StringFlag{Name: "embedded-broker", Value: mqttdev.DefaultEmbeddedBroker, Usage: "loopback address of the embedded MQTT broker"},
		&cli.DurationFlag{Name: "embedded-broker-lease", Value: broker.DefaultLease,
			Usage: "hosting lease of the embedded broker: when its host dies, another worker on the host takes it over within about this long"},
		&cli.BoolFlag{Name: "mqtt-anonymous", Usage: "the embedded broker, when hosted here, lets every client in with every right and no credential (a lab only)"},
		&cli.StringFlag{Name: "mqtt-user", EnvVars: []string{"LEASEPOOL_MQTT_USER"}, Usage: "MQTT user name"},
		&cli.StringFlag{Name: "mqtt-password", EnvVars: []string{"LEASEPOOL_MQTT_PASSWORD"}, Usage: "MQTT password"},
		&cli.StringFlag{Name: "mqtt-ca", Usage: "CA certificate (PEM) that signs the broker's"},
		&cli.StringFlag{Name: "mqtt-cert", Usage: "client certificate (PEM)"},
		&cli.StringFlag{Name: "mqtt-key", Usage: "client key (PEM)"},
		&cli.StringFlag{Name: "prefix", Value: mqttdev.DefaultPrefix, Usage: "first MQTT topic level"},
	}
}

// deviceConfig maps the worker's broker flags to worker.Devices: --mqtt,
// or the embedded broker at --embedded-broker hosted by one worker sharing
// the store at a time.
func deviceConfig(c *cli.Context) worker.Devices {
	return worker.Devices{
		Client: mqttdev.ClientConfig{
			BrokerURL: c.String("mqtt"),
			Username:  c.String("mqtt-user"), Password: c.String("mqtt-password"),
			CAFile: c.String("mqtt-ca"), CertFile: c.String("mqtt-cert"), KeyFile: c.String("mqtt-key"),
		},
		EmbeddedBroker:          c.String("embedded-broker"),
		EmbeddedBrokerLease:     c.Duration("embedded-broker-lease"),
		EmbeddedBrokerAnonymous: c.Bool("mqtt-anonymous"),
		Prefix:                  c.String("prefix"),
		BrokerLogger:            slog.New(minLevel{slog.Default().Handler(), slog.LevelError}).With(slog.String("component", "mqtt-broker")),
	}
}

func simConfig(c *cli.Context) (device.Config, error) {
	cfg := device.Config{
		BrokerURL: c.String("mqtt"),
		Username:  c.String("mqtt-user"),
		Password:  c.String("mqtt-password"),
		Prefix:    c.String("prefix"),
		Count:     c.Int("count"),
		IDPrefix:  c.String("id-prefix"),
		First:     c.Int("first"),
		Seed:      c.Int64("seed"),
		Logger:    slog.Default(),
	}
	if cfg.Count < 1 {
		return cfg, fmt.Errorf("--count: must be at least 1, got %d", cfg.Count)
	}
	if cfg.First < 0 {
		return cfg, fmt.Errorf("--first: must not be negative, got %d", cfg.First)
	}
	if err := mqttdev.ValidateID("prefix", cfg.Prefix); err != nil {
		return cfg, fmt.Errorf("--prefix: %w", err)
	}
	if err := mqttdev.ValidateID("id-prefix", cfg.IDPrefix); err != nil {
		return cfg, fmt.Errorf("--id-prefix: %w", err)
	}
	attrs, err := simAttributes(c.StringSlice("attr"))
	if err != nil {
		return cfg, err
	}
	if len(attrs) > 0 {
		cfg.Attributes = func(i int, _ string) mqttdev.Labels {
			l := mqttdev.Labels{}
			for k, vs := range attrs {
				l[k] = vs[i%len(vs)]
			}
			return l
		}
	}
	every := map[string]int{}
	for _, name := range []string{"fail-every", "offline-every", "slow-every", "outage-every"} {
		if every[name] = c.Int(name); every[name] < 0 {
			return cfg, fmt.Errorf("--%s: must not be negative, got %d", name, every[name])
		}
	}
	if n := every["outage-every"]; n > 0 {
		cfg.Outage = device.ScheduledOutage{Every: n, After: c.Duration("outage-after"), For: c.Duration("outage-for"), Spread: c.Duration("outage-spread")}
		if cfg.Outage.Spread < 0 {
			return cfg, fmt.Errorf("--outage-spread: must not be negative, got %s", cfg.Outage.Spread)
		}
		if cfg.Outage.After < 0 {
			return cfg, fmt.Errorf("--outage-after: must not be negative, got %s", cfg.Outage.After)
		}
		if cfg.Outage.For <= 0 {
			return cfg, fmt.Errorf("--outage-for: must be a positive duration, got %s", cfg.Outage.For)
		}
	}
	slow := c.Duration("slow-latency")
	if slow <= 0 {
		return cfg, fmt.Errorf("--slow-latency: must be a positive duration, got %s", slow)
	}
	succeed := c.StringSlice("succeed")
	for _, cmd := range succeed {
		if cmd == "" {
			return cfg, fmt.Errorf("--succeed: a command name must not be empty")
		}
	}
	if every["fail-every"]+every["offline-every"]+every["slow-every"] > 0 {
		cfg.Behavior = func(i int) device.Behavior {
			var b device.Behavior
			if n := every["fail-every"]; n > 0 && i%n == n-1 {
				b.Fail, b.Succeed = true, succeed
			}
			if n := every["offline-every"]; n > 0 && i%n == 0 {
				b.Offline = true
			}
			if n := every["slow-every"]; n > 0 && i%n == 1%n {
				b.Latency = slow
			}
			return b
		}
	}
	for _, r := range []struct {
		name string
		dst  *float64
	}{{"fail-rate", &cfg.FailRate}, {"offline-rate", &cfg.OfflineRate}, {"drop-ack-rate", &cfg.DropAckRate}} {
		v := c.Float64(r.name)
		if !(v >= 0 && v <= 1) {
			return cfg, fmt.Errorf("--%s: must be in [0,1], got %v", r.name, v)
		}
		*r.dst = v
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"latency", &cfg.Latency}, {"offline-for", &cfg.OfflineFor}, {"heartbeat", &cfg.Heartbeat}, {"duration", nil}, {"start-timeout", nil}} {
		if !c.IsSet(d.name) {
			if d.dst != nil {
				*d.dst = c.Duration(d.name)
			}
			continue
		}
		v := c.Duration(d.name)
		if v <= 0 {
			return cfg, fmt.Errorf("--%s: must be a positive duration, got %s", d.name, v)
		}
		if d.dst != nil {
			*d.dst = v
		}
	}
	return cfg, nil
}

func devicesCommand(openStore func(*cli.Context) (task.Store, error)) *cli.Command {
	return &cli.Command{
		Name:  "devices",
		Usage: "list devices: online state (as the workers recorded it in the store), new or vouched for, running command and holder, queue length, operator labels, announced attributes",
		Flags: append(mqttFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.StringFlag{Name: "select", Usage: "only devices that match k=v,k!=v (operator labels), attr:k=v,attr:k!=v (announced attributes), ..."},
			&cli.BoolFlag{Name: "new", Usage: "only new devices: those nobody vouched for (leasepool device approve)"},
			&cli.BoolFlag{Name: "from-broker", Usage: "read online states from the broker's retained status messages instead of the store"},
			&cli.DurationFlag{Name: "wait", Value: time.Second, Usage: "how long to collect status messages from the broker"},
		),
		Action: func(c *cli.Context) error {
			wait := c.Duration("wait")
			if wait <= 0 {
				return fmt.Errorf("--wait: must be a positive duration, got %s", wait)
			}
			if err := mqttdev.ValidateID("prefix", c.String("prefix")); err != nil {
				return fmt.Errorf("--prefix: %w", err)
			}
			var sel mqttdev.Selector
			if v := c.String("select"); c.IsSet("select") {
				var err error
				if sel, err = mqttdev.ParseSelector(v); err != nil {
					return badFlag(c, "select", "%v", err)
				}
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			defer s.Close()
			// Online states: as the workers recorded them in the store, or
			// straight from the broker's retained status messages.
			var states mqttdev.DeviceStates
			switch {
			case c.Bool("from-broker"):
				cc := mqttdev.ClientConfig{BrokerURL: c.String("mqtt"), Username: c.String("mqtt-user"), Password: c.String("mqtt-password")}
				if cc.Username == "" && mqttdev.LoopbackBroker(cc.BrokerURL) {
					// A broker on this machine: the embedded one lets in
					// the workers of the store, this tool among them.
					if cc.Password, err = credential.WorkerSecret(c.Context, s); err != nil {
						return err
					}
					cc.Username = credential.WorkerUser("devices-" + strconv.Itoa(os.Getpid()))
				}
				t, err := mqttdev.ReadStates(c.Context, cc, c.String("prefix"), wait)
				if err != nil {
					return fmt.Errorf("--mqtt %s: %w", redact.URL(c.String("mqtt")), redact.Error(err, []string{c.String("mqtt")}, c.String("mqtt-password")))
				}
				states = t
			default:
				list, err := mqttdev.StoreStates(s).DeviceStates(c.Context)
				if err != nil {
					return err
				}
				states = mqttdev.StateList(list)
			}
			infos, err := mqttdev.ListDevices(c.Context, s, states)
			if err != nil {
				return err
			}
			if sel != nil {
				infos = slices.DeleteFunc(infos, func(d mqttdev.DeviceInfo) bool { return !sel.Matches(d.Labels, d.Attributes) })
			}
			if c.Bool("new") {
				infos = slices.DeleteFunc(infos, func(d mqttdev.DeviceInfo) bool { return !d.New })
			}
			if c.Bool("json") {
				return writeJSON(c.App.Writer, infos)
			}
			return printDevices(c.App.Writer, infos, states != nil)
		},
	}
}

func printDevices(w io.Writer, infos []mqttdev.DeviceInfo, haveStates bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tTRUST\tCURRENT\tCOMMAND\tHOLDER\tQUEUED\tLABELS\tATTRIBUTES")
	for _, d := range infos {
		state := "unknown"
		switch {
		case d.Known && d.Online:
			state = "online"
		case d.Known:
			state = "offline"
		case !haveStates:
			state = "-"
		}
		holder := d.Holder
		if holder != "" {
			holder = fmt.Sprintf("%s#%d", d.Holder, d.Attempt)
		}
		trust := "vouched"
		if d.New {
			trust = "new"
		}
		// What the store holds may have been written around the checks
		// (by hand, by another tool): none of it reaches the terminal raw.
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", printable(d.ID), state, trust, printable(dash(d.Current)), printable(dash(d.Command)),
			printable(dash(holder)), d.Queued, printable(dash(d.Labels.String())), printable(dash(d.Attributes.String())))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// simAttributes reads --attr k=v and k=v1|v2: each key's values.
func simAttributes(flags []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("--attr: %q: want k=v or k=v1|v2", f)
		}
		for _, one := range strings.Split(v, "|") {
			if err := mqttdev.ValidateLabelKey(k); err != nil {
				return nil, fmt.Errorf("--attr: %w", err)
			}
			if err := mqttdev.ValidateLabelValue(k, one); err != nil {
				return nil, fmt.Errorf("--attr: %w", err)
			}
			out[k] = append(out[k], one)
		}
	}
	if len(out) > mqttdev.MaxLabels {
		return nil, fmt.Errorf("--attr: %d keys, more than %d", len(out), mqttdev.MaxLabels)
	}
	return out, nil
}

func deviceLabel(c *cli.Context) error {
	if c.NArg() < 2 {
		return badUsage(c, "want a device ID and at least one k=v or k-, got %d arguments", c.NArg())
	}
	id := c.Args().First()
	if err := mqttdev.ValidateID("device", id); err != nil {
		return err
	}
	ch, err := mqttdev.ParseLabelArgs(c.Args().Tail())
	if err != nil {
		return err
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	inv, err := mqttdev.SetLabels(c.Context, s, id, ch)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return writeJSON(c.App.Writer, inv)
	}
	fmt.Fprintf(c.App.Writer, "%s labels %s; announced attributes %s\n", id, printable(dash(inv.Labels.String())), printable(dash(inv.Attributes.String())))
	return nil
}
