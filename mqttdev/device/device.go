// One simulated device: what it does with the commands it gets.

package device

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/mqttdev/protocol"
)

type attemptKey struct {
	key     string
	attempt int
}

// Device is one simulated device.
type Device struct {
	id     string
	cfg    *Config
	attrs  protocol.Labels
	behave Behavior
	topics protocol.Topics
	tr     protocol.Transport
	logger *slog.Logger
	// arrived wakes receive when onMessage added to inbox: a slice, not a
	// buffered channel, so that an idle device of a fleet of thousands
	// holds no buffer and a burst of copies is never dropped.
	arrived chan struct{}
	work    chan struct{}

	// life ends when the simulator stops: a status publish paho started
	// on its own goroutine (onConnect) gives up then instead of outliving
	// Stop, and Stop waits for it through handlers.
	life     context.Context
	endLife  context.CancelFunc
	handlers sync.WaitGroup

	mu           sync.Mutex
	rng          *rand.Rand
	conn         *outageConn
	offlineUntil time.Time
	// away is the outage under way: its Back is set by the first online
	// status published after it.
	away      *Outage
	outages   []Outage
	inbox     []protocol.CommandMessage
	highest   map[string]int
	done      map[attemptKey]protocol.Reply
	doneOrder []attemptKey
	running   *protocol.CommandMessage
	queue     []protocol.CommandMessage
	runs      []Run
	overlaps  []Overlap
	stale     []StaleAttempt
	counts    Counts
}

// ID returns the device id.
func (d *Device) ID() string { return d.id }

// Running returns the command being run, if any.
func (d *Device) Running() (protocol.CommandMessage, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running == nil {
		return protocol.CommandMessage{}, false
	}
	return *d.running, true
}

// GoOffline drops the device's connection abruptly (the broker publishes
// its will) and keeps it away for dur: the client notices at once, its
// reconnect attempts are refused until dur has passed, and the first one
// after that connects again and publishes the online status.
func (d *Device) GoOffline(dur time.Duration) {
	now := time.Now()
	d.mu.Lock()
	d.offlineUntil = now.Add(dur)
	c := d.conn
	d.counts.Outages++
	if d.away == nil {
		d.outages = append(d.outages, Outage{Device: d.id, From: now.UTC(), Until: d.offlineUntil.UTC()})
		d.away = &d.outages[len(d.outages)-1]
	} else {
		// An outage begun while away lengthens the one under way.
		d.away.Until = d.offlineUntil.UTC()
	}
	d.mu.Unlock()
	d.logger.Info("going offline", slog.Duration("for", dur))
	if c != nil {
		c.cut()
	}
}

var errSimOffline = errors.New("simulated outage")

// outageConn is a device's connection to the broker, which an outage cuts.
// paho takes "use of closed network connection" for its own close after a
// DISCONNECT and does not report it: a connection merely closed under it
// would look open until the keepalive failed (15 s). After a cut, reads
// and writes fail with errSimOffline instead, as on a reset link, so paho
// sees the connection lost at once and starts reconnecting.
type outageConn struct {
	net.Conn
	isCut atomic.Bool
}

func (c *outageConn) cut() {
	c.isCut.Store(true)
	_ = c.Conn.Close()
}

func (c *outageConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && c.isCut.Load() {
		err = fmt.Errorf("read: %w", errSimOffline)
	}
	return n, err
}

func (c *outageConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil && c.isCut.Load() {
		err = fmt.Errorf("write: %w", errSimOffline)
	}
	return n, err
}

// dial is the client's dial: during an outage it waits for the outage's
// end, so the device stays away until then and is back at once after,
// not a reconnect backoff step later (a thousand devices back at once
// would otherwise be spread over a second).
func (d *Device) dial(u *url.URL, tc *tls.Config) (net.Conn, error) {
	for {
		d.mu.Lock()
		wait := time.Until(d.offlineUntil)
		d.mu.Unlock()
		if wait <= 0 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-d.life.Done():
			t.Stop()
			return nil, errSimOffline
		}
	}
	nc, err := protocol.DialBroker(u, tc)
	if err != nil {
		return nil, err
	}
	c := &outageConn{Conn: nc}
	d.mu.Lock()
	defer d.mu.Unlock()
	// An outage that began while this dial was under way cuts it too.
	if time.Now().Before(d.offlineUntil) {
		_ = nc.Close()
		return nil, errSimOffline
	}
	d.conn = c
	return c, nil
}

func (d *Device) onConnect() {
	d.mu.Lock()
	if d.life.Err() != nil {
		d.mu.Unlock()
		return
	}
	d.handlers.Add(1)
	d.mu.Unlock()
	defer d.handlers.Done()
	if d.publishStatus(true) {
		d.mu.Lock()
		if d.away != nil {
			d.away.Back = time.Now().UTC()
			d.away = nil
		}
		d.mu.Unlock()
	}
	if d.behave.Offline {
		d.mu.Lock()
		gone := d.counts.Outages > 0
		d.mu.Unlock()
		if !gone {
			go d.GoOffline(24 * time.Hour)
		}
	}
}

// stop ends the device's life and waits for the status publishes under
// way on paho's goroutines.
func (d *Device) stop() {
	d.mu.Lock()
	d.endLife()
	d.mu.Unlock()
	d.handlers.Wait()
}

// publishStatus publishes the device's status, retained, and reports
// whether the broker took it.
func (d *Device) publishStatus(online bool) bool {
	st := protocol.Status{Online: online, At: time.Now().UTC()}
	if online {
		st.Attributes = d.attrs
	}
	b, _ := protocol.Encode(st)
	ctx, cancel := context.WithTimeout(d.life, 5*time.Second)
	defer cancel()
	if err := d.tr.Publish(ctx, d.topics.Device(d.id, protocol.TopicStatus), true, b); err != nil {
		d.logger.Debug("status not published", slog.Any("error", err))
		return false
	}
	return true
}

// onMessage runs on paho's goroutine: decode and queue, never block.
func (d *Device) onMessage(m protocol.Message) {
	if _, kind, ok := d.topics.Parse(m.Topic); !ok || kind != protocol.TopicCmd {
		return
	}
	c, err := protocol.DecodeCommand(m.Payload)
	d.mu.Lock()
	if err != nil {
		d.counts.BadMessages++
		d.mu.Unlock()
		d.logger.Warn("bad command", slog.Any("error", err))
		return
	}
	d.counts.Received++
	d.inbox = append(d.inbox, c)
	d.mu.Unlock()
	select {
	case d.arrived <- struct{}{}:
	default:
	}
}

func (d *Device) reply(ctx context.Context, kind string, r protocol.Reply) {
	b, _ := protocol.Encode(r)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.tr.Publish(ctx, d.topics.Device(d.id, kind), false, b); err != nil {
		d.logger.Debug("reply not published", slog.String("kind", kind), slog.Any("error", err))
	}
}

// receive decides for each command: stale, duplicate, or new.
func (d *Device) receive(ctx context.Context) {
	for {
		d.mu.Lock()
		if len(d.inbox) == 0 {
			d.inbox = nil // an idle device keeps no array
			d.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-d.arrived:
				continue
			}
		}
		c := d.inbox[0]
		d.inbox = d.inbox[1:]
		d.mu.Unlock()
		ack := protocol.Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: c.Attempt, OK: true, Traceparent: c.Traceparent}
		k := attemptKey{c.TaskKey, c.Attempt}
		now := time.Now().UTC()
		d.mu.Lock()
		high := d.highest[c.TaskKey]
		cached, isDone := d.done[k]
		inQueue := d.running != nil && d.running.TaskKey == c.TaskKey && d.running.Attempt == c.Attempt
		for _, q := range d.queue {
			inQueue = inQueue || (q.TaskKey == c.TaskKey && q.Attempt == c.Attempt)
		}
		var sendAck, sendResult bool
		switch {
		case c.Attempt < high:
			d.stale = append(d.stale, StaleAttempt{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, Highest: high, At: now})
			ack.OK, ack.Code, ack.Error = false, protocol.CodeStale, fmt.Sprintf("stale attempt %d < %d", c.Attempt, high)
			sendAck = true
		case !isDone && !inQueue && !c.ExpiresAt.IsZero() && now.After(c.ExpiresAt):
			d.counts.Expired++
			ack.OK, ack.Code, ack.Error = false, protocol.CodeExpired, "expired at "+c.ExpiresAt.Format(time.RFC3339Nano)
			sendAck = true
		case isDone || inQueue:
			d.counts.Duplicates++
			sendAck = d.rng.Float64() >= d.cfg.DropAckRate
			sendResult = isDone
		default:
			d.highest[c.TaskKey] = c.Attempt
			if d.running != nil || len(d.queue) > 0 {
				o := Overlap{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, At: now}
				if d.running != nil {
					o.RunningTask, o.RunningAttempt = d.running.TaskKey, d.running.Attempt
				} else {
					o.RunningTask, o.RunningAttempt = d.queue[0].TaskKey, d.queue[0].Attempt
				}
				d.overlaps = append(d.overlaps, o)
			}
			d.queue = append(d.queue, c)
			sendAck = d.rng.Float64() >= d.cfg.DropAckRate
		}
		if !sendAck {
			d.counts.DroppedAcks++
		}
		d.mu.Unlock()
		select {
		case d.work <- struct{}{}:
		default:
		}
		if ack.Code == protocol.CodeStale {
			d.logger.Warn("stale attempt refused", slog.String("task", c.TaskKey), slog.Int("attempt", c.Attempt), slog.Int("highest", high))
		}
		if sendAck {
			d.reply(ctx, protocol.TopicAck, ack)
		}
		if sendResult {
			d.reply(ctx, protocol.TopicResult, cached)
		}
	}
}

// execute runs queued commands one at a time.
func (d *Device) execute(ctx context.Context) {
	for {
		d.mu.Lock()
		if len(d.queue) == 0 {
			d.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-d.work:
				continue
			}
		}
		c := d.queue[0]
		d.queue = d.queue[1:]
		d.running = &c
		d.mu.Unlock()

		run := Run{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, CorrelationID: c.CorrelationID, Command: c.Command,
			SentAt: c.SentAt, Start: time.Now().UTC(), Traceparent: c.Traceparent}
		latency := d.cfg.Latency
		if d.behave.Latency > 0 {
			latency = d.behave.Latency
		}
		if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		d.mu.Lock()
		fail := d.rng.Float64() < d.cfg.FailRate || (d.behave.Fail && !slices.Contains(d.behave.Succeed, c.Command))
		offline := d.rng.Float64() < d.cfg.OfflineRate
		run.End, run.OK = time.Now().UTC(), !fail
		res := protocol.Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: c.Attempt, OK: !fail, Traceparent: c.Traceparent}
		if fail {
			res.Error = "simulated failure"
			d.counts.Failed++
		} else {
			res.Output = []byte(fmt.Sprintf(`{"device":%q,"command":%q}`, d.id, c.Command))
		}
		d.counts.Ran++
		d.runs = append(d.runs, run)
		k := attemptKey{c.TaskKey, c.Attempt}
		d.done[k] = res
		d.doneOrder = append(d.doneOrder, k)
		if len(d.doneOrder) > 4096 {
			delete(d.done, d.doneOrder[0])
			d.doneOrder = d.doneOrder[1:]
		}
		d.running = nil
		d.mu.Unlock()
		d.reply(ctx, protocol.TopicResult, res)
		if offline {
			d.GoOffline(d.cfg.OfflineFor)
		}
	}
}

func (d *Device) heartbeat(ctx context.Context) {
	t := time.NewTicker(d.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if d.tr.Connected() {
				d.publishStatus(true)
			}
		}
	}
}
