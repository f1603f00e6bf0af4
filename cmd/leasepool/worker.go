package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/builtin"
	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "claim and run tasks until SIGINT or SIGTERM",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "worker id (default host-pid-random)"},
			&cli.StringFlag{Name: "kinds", Usage: "comma-separated kinds to run (default all built-in kinds)"},
			&cli.IntFlag{Name: "concurrency", Value: 8, Usage: "handlers running at once"},
			&cli.StringFlag{Name: "mqtt", EnvVars: []string{"LEASEPOOL_MQTT_URL"},
				Usage: "MQTT broker for device tasks (tcp://, ssl://); empty: use the embedded broker at --embedded-broker, starting it if no other worker has"},
			&cli.StringFlag{Name: "embedded-broker", Value: "127.0.0.1:1883", Usage: "loopback address of the embedded MQTT broker"},
			&cli.StringFlag{Name: "mqtt-user", EnvVars: []string{"LEASEPOOL_MQTT_USER"}, Usage: "MQTT user name"},
			&cli.StringFlag{Name: "mqtt-password", EnvVars: []string{"LEASEPOOL_MQTT_PASSWORD"}, Usage: "MQTT password"},
			&cli.StringFlag{Name: "mqtt-ca", Usage: "CA certificate (PEM) that signs the broker's"},
			&cli.StringFlag{Name: "mqtt-cert", Usage: "client certificate (PEM)"},
			&cli.StringFlag{Name: "mqtt-key", Usage: "client key (PEM)"},
			&cli.StringFlag{Name: "prefix", Value: mqttdev.DefaultPrefix, Usage: "first MQTT topic level"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second,
				Usage: "on SIGINT/SIGTERM, how long running handlers may finish before they are cancelled and their leases released"},
		},
		Action: func(c *cli.Context) error {
			if c.Int("concurrency") < 1 {
				return fmt.Errorf("--concurrency: must be at least 1, got %d", c.Int("concurrency"))
			}
			if _, err := positiveDuration(c, "shutdown-timeout"); err != nil {
				return err
			}
			known := append(slices.Clone(builtin.Kinds), mqttdev.Kind)
			kinds, err := listFlag(c, "kinds")
			if err != nil {
				return err
			}
			for _, k := range kinds {
				if !slices.Contains(known, k) {
					return fmt.Errorf("--kinds: %q is not a kind this worker can run (%v)", k, known)
				}
			}
			if len(kinds) == 0 {
				kinds = known
			}
			if c.String("id") != "" {
				if err := task.ValidateName("--id", c.String("id")); err != nil {
					return err
				}
			}
			mux := consumer.NewMux()
			builtin.Register(mux)
			s, err := openStore(c, false)
			if err != nil {
				return err
			}
			defer s.Close()
			w, err := consumer.New(consumer.Config{
				Store: s, Handler: mux, WorkerID: c.String("id"), Kinds: kinds,
				Concurrency: c.Int("concurrency"), ShutdownTimeout: c.Duration("shutdown-timeout"),
				Logger: slog.Default(),
			})
			if err != nil {
				return err
			}
			// Shutdown order: the consumer stops first (its handlers may be
			// talking to devices), then the MQTT client, then the broker.
			if slices.Contains(kinds, mqttdev.Kind) {
				stop, err := startDevices(c, mux, s, w.WorkerID())
				if err != nil {
					return err
				}
				defer stop()
			}
			if err := w.Start(context.WithoutCancel(c.Context)); err != nil {
				return err
			}
			<-c.Context.Done() // SIGINT or SIGTERM
			slog.Info("shutting down: finishing running tasks", slog.Duration("timeout", c.Duration("shutdown-timeout")))
			return w.Stop(context.Background())
		},
	}
}

// startDevices registers the device kind on mux: it connects to --mqtt, or
// to the embedded broker, starting one when no other worker on this host
// has.
func startDevices(c *cli.Context, mux *consumer.Mux, store task.Store, workerID string) (stop func(), err error) {
	url := c.String("mqtt")
	var broker *mqttdev.Broker
	if url == "" {
		addr := c.String("embedded-broker")
		// The broker logs every client that drops at warn level: keep errors.
		quiet := slog.New(minLevel{slog.Default().Handler(), slog.LevelError}).With(slog.String("component", "mqtt-broker"))
		broker, err = mqttdev.StartBroker(c.Context, addr, quiet)
		switch {
		case err == nil:
			url = broker.URL()
			slog.Info("embedded MQTT broker started", slog.String("url", url))
		case errors.Is(err, syscall.EADDRINUSE):
			url = "tcp://" + addr
			slog.Info("using the embedded MQTT broker another worker started", slog.String("url", url))
		default:
			return nil, fmt.Errorf("--embedded-broker: %w", err)
		}
	}
	h, err := mqttdev.NewHandler(mqttdev.HandlerConfig{
		ClientConfig: mqttdev.ClientConfig{
			BrokerURL: url, ClientID: "leasepool-worker-" + workerID,
			Username: c.String("mqtt-user"), Password: c.String("mqtt-password"),
			CAFile: c.String("mqtt-ca"), CertFile: c.String("mqtt-cert"), KeyFile: c.String("mqtt-key"),
		},
		Prefix:      c.String("prefix"),
		Logger:      slog.Default(),
		DeviceState: deviceStateStore(store),
	})
	if err == nil {
		err = h.Start(c.Context)
	}
	if err != nil {
		if broker != nil {
			broker.Close()
		}
		return nil, fmt.Errorf("--mqtt: %w", err)
	}
	mux.Register(mqttdev.Kind, h)
	return func() {
		h.Stop(context.Background())
		if broker != nil {
			broker.Close()
		}
	}, nil
}

// deviceStateStore keeps device states in the task store when it can hold
// shared records, so every worker and `leasepool devices` see them.
func deviceStateStore(s task.Store) mqttdev.DeviceStateStore {
	if rs, ok := s.(task.RecordStore); ok {
		return mqttdev.StoreStates(rs)
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
