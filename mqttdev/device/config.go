// Package device is the device side of leasepool's MQTT device protocol:
// a Simulator runs simulated devices, each with its own MQTT client, last
// will and heartbeat, that follow the device rules (see the mqttdev
// package documentation) and record what they saw, so tests and demos can
// check that no device ever ran two commands at once. It imports the
// shared protocol package, never the worker side (mqttdev).
package device

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/mqttdev/protocol"
)

// Config configures a fleet of simulated devices.
type Config struct {
	// BrokerURL as in protocol.ClientConfig. Required.
	BrokerURL string
	// Username and Password authenticate every device; empty means none.
	Username, Password string
	// Secrets are the devices' own credentials, by device id: a device
	// listed logs in with its id as user name and its secret as password,
	// in place of Username and Password.
	Secrets map[string]string
	// Prefix is the first topic level; empty means protocol.DefaultPrefix.
	Prefix string
	// Count is how many devices to run; at least 1.
	Count int
	// IDPrefix starts every device id; the index follows (dev-0, dev-1...).
	// Empty means "dev-".
	IDPrefix string
	// First is the index of the first device: simulators of one fleet
	// split across processes each run Count devices from their own First.
	First int
	// Latency is how long each command runs; zero means at once.
	Latency time.Duration
	// FailRate is the probability that a command reports failure.
	FailRate float64
	// OfflineRate is the probability that a device drops its connection
	// (abruptly, so the broker sends its will) after finishing a command,
	// staying away for OfflineFor.
	OfflineRate float64
	// OfflineFor is how long an outage lasts; zero means 3s.
	OfflineFor time.Duration
	// Outage, when its Every is set, takes part of the fleet away at once.
	Outage ScheduledOutage
	// DropAckRate is the probability that a device sends no ack for a
	// command it accepts (it still runs it).
	DropAckRate float64
	// Heartbeat is the period of the online status republish; zero means 5s.
	Heartbeat time.Duration
	// Attributes, when set, gives device i (id) the attributes it
	// announces in its online statuses (model, firmware, site...).
	Attributes func(i int, id string) protocol.Labels
	// Behavior, when set, gives device i a behaviour of its own: always
	// failing, away for good, or slow.
	Behavior func(i int) Behavior
	// Seed makes the random choices repeatable.
	Seed int64
	// Logger gets the devices' logs; nil discards them.
	Logger *slog.Logger
}

// ScheduledOutage takes every Every-th device (index 0, Every, 2*Every,
// ...) away at once, After the simulator started, for For: each drops its
// connection abruptly (the broker sends its will) and is back, its online
// status published, as soon as its outage has passed. Spread, when set,
// staggers the returns: the k-th of n devices away stays For+Spread*k/n.
type ScheduledOutage struct {
	Every              int
	After, For, Spread time.Duration
}

// Behavior is one device's own behaviour, beside the fleet's rates.
type Behavior struct {
	// Fail makes every command the device runs report failure (not the
	// commands named in Succeed).
	Fail bool
	// Succeed names commands that succeed even on a failing device (a
	// rollback that works where the update did not).
	Succeed []string
	// Offline: the device connects once, announces itself, then drops
	// (the broker sends its will) and stays away.
	Offline bool
	// Latency, when positive, replaces Config.Latency for this device.
	Latency time.Duration
}

func (c *Config) validate() error {
	cc := protocol.ClientConfig{BrokerURL: c.BrokerURL}
	if err := cc.Validate(); err != nil {
		return err
	}
	if c.Prefix == "" {
		c.Prefix = protocol.DefaultPrefix
	}
	if err := protocol.ValidateID("prefix", c.Prefix); err != nil {
		return err
	}
	if c.IDPrefix == "" {
		c.IDPrefix = "dev-"
	}
	if c.Count < 1 {
		return fmt.Errorf("count: %d must be at least 1", c.Count)
	}
	if c.First < 0 {
		return fmt.Errorf("first: %d is negative", c.First)
	}
	if err := protocol.ValidateID("id_prefix", c.IDPrefix+strconv.Itoa(c.First+c.Count-1)); err != nil {
		return err
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail_rate", c.FailRate}, {"offline_rate", c.OfflineRate}, {"drop_ack_rate", c.DropAckRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			return fmt.Errorf("%s: %v is not in [0,1]", r.name, r.v)
		}
	}
	if c.Outage.Every < 0 {
		return fmt.Errorf("outage every: %d is negative", c.Outage.Every)
	}
	if c.Outage.Every > 0 && (c.Outage.After < 0 || c.Outage.For <= 0 || c.Outage.Spread < 0) {
		return fmt.Errorf("outage: after %s, for %s, spread %s: want after >= 0, for > 0, spread >= 0", c.Outage.After, c.Outage.For, c.Outage.Spread)
	}
	if c.Latency < 0 || c.OfflineFor < 0 || c.Heartbeat < 0 {
		return errors.New("latency, offline_for, heartbeat: must not be negative")
	}
	if c.OfflineFor == 0 {
		c.OfflineFor = 3 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
