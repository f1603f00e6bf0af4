package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

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
		Usage: "MQTT device tools: a device simulator and an embedded broker",
		Subcommands: []*cli.Command{
			{
				Name:  "simulate",
				Usage: "run simulated devices until interrupted (or --duration), then print what they saw",
				Flags: append(mqttFlags(),
					&cli.IntFlag{Name: "count", Value: 1, Usage: "number of devices"},
					&cli.StringFlag{Name: "id-prefix", Value: "dev-", Usage: "device ids are this prefix and an index"},
					&cli.DurationFlag{Name: "latency", Usage: "how long each command runs"},
					&cli.Float64Flag{Name: "fail-rate", Usage: "probability that a command fails, in [0,1]"},
					&cli.Float64Flag{Name: "offline-rate", Usage: "probability that a device drops offline after a command, in [0,1]"},
					&cli.DurationFlag{Name: "offline-for", Value: 3 * time.Second, Usage: "how long an outage lasts"},
					&cli.Float64Flag{Name: "drop-ack-rate", Usage: "probability that a device sends no ack, in [0,1]"},
					&cli.DurationFlag{Name: "heartbeat", Value: 5 * time.Second, Usage: "online status period"},
					&cli.Int64Flag{Name: "seed", Value: 1, Usage: "random seed"},
					&cli.DurationFlag{Name: "duration", Usage: "stop after this long", DefaultText: "until interrupted"},
					&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
				),
				Action: func(c *cli.Context) error {
					warnSecretFlag(c, "mqtt", "LEASEPOOL_MQTT_URL", true)
					warnSecretFlag(c, "mqtt-password", "LEASEPOOL_MQTT_PASSWORD", false)
					cfg, err := simConfig(c)
					if err != nil {
						return err
					}
					ctx := c.Context
					if d := c.Duration("duration"); d > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, d)
						defer cancel()
					}
					progress := c.App.Writer
					if c.Bool("json") {
						progress = c.App.ErrWriter
					}
					r, err := device.RunSimulator(ctx, cfg, progress)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return deviceJSON(c.App.Writer, r)
					}
					if len(r.Overlaps) > 0 {
						return fmt.Errorf("%d overlapping commands: one device ran two commands at once", len(r.Overlaps))
					}
					return nil
				},
			},
			{
				Name:  "broker",
				Usage: "run an embedded MQTT broker on a loopback address until interrupted",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "listen", Value: "127.0.0.1:1883", Usage: "loopback address to listen on"},
				},
				Action: func(c *cli.Context) error {
					b, err := broker.Listen(c.Context, c.String("listen"), slog.Default())
					if err != nil {
						return fmt.Errorf("--listen: %w", err)
					}
					defer b.Close()
					fmt.Fprintf(c.App.Writer, "broker listening on %s\n", b.URL())
					<-c.Context.Done()
					return nil
				},
			},
		},
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
		EmbeddedBroker:      c.String("embedded-broker"),
		EmbeddedBrokerLease: c.Duration("embedded-broker-lease"),
		Prefix:              c.String("prefix"),
		BrokerLogger:        slog.New(minLevel{slog.Default().Handler(), slog.LevelError}).With(slog.String("component", "mqtt-broker")),
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
		Seed:      c.Int64("seed"),
		Logger:    slog.Default(),
	}
	if cfg.Count < 1 {
		return cfg, fmt.Errorf("--count: must be at least 1, got %d", cfg.Count)
	}
	if err := mqttdev.ValidateID("prefix", cfg.Prefix); err != nil {
		return cfg, fmt.Errorf("--prefix: %w", err)
	}
	if err := mqttdev.ValidateID("id-prefix", cfg.IDPrefix); err != nil {
		return cfg, fmt.Errorf("--id-prefix: %w", err)
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
	}{{"latency", &cfg.Latency}, {"offline-for", &cfg.OfflineFor}, {"heartbeat", &cfg.Heartbeat}, {"duration", nil}} {
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
		Usage: "list devices: online state (as the workers recorded it in the store), running command and holder, queue length",
		Flags: append(mqttFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
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
				t, err := mqttdev.ReadStates(c.Context, mqttdev.ClientConfig{
					BrokerURL: c.String("mqtt"), Username: c.String("mqtt-user"), Password: c.String("mqtt-password"),
				}, c.String("prefix"), wait)
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
			if c.Bool("json") {
				return deviceJSON(c.App.Writer, infos)
			}
			return printDevices(c.App.Writer, infos, states != nil)
		},
	}
}

func printDevices(w io.Writer, infos []mqttdev.DeviceInfo, haveStates bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tCURRENT\tCOMMAND\tHOLDER\tQUEUED")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", d.ID, state, dash(d.Current), dash(d.Command), dash(holder), d.Queued)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func deviceJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}
