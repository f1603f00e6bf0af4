// One attempt of a device command, in phases: publish, await the ack
// (with the device, or the handler's own link, gone meanwhile), await the
// result.

package mqttdev

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/tracing"
)

// attempt is one Handle call's exchange with a device: the command it
// sends, the replies it waits for, and where that stands.
type attempt struct {
	h     *Handler
	ctx   context.Context
	job   *consumer.Job // its log carries sent, acked and result into the task's history and events
	tr    Transport
	log   *slog.Logger
	cmd   Command
	msg   CommandMessage
	topic string
	w     *waiter

	ackTimeout, resultTimeout time.Duration
	// linkWait is how long the attempt holds its device while the
	// handler's own connection is down.
	linkWait time.Duration

	// pubLosses and pubDown describe the link when the last copy went out:
	// a copy that our own connection loss kept from the device spends no
	// publish.
	pubLosses int
	pubDown   bool

	acked       bool
	result      *Reply // set by a result, which may come before any ack
	offlineSeen bool   // the device went offline while a copy waited
	awayUntil   time.Time
	published   time.Time // the task's publish, for Command.OfflineTimeout
}

// newAttempt makes the attempt and registers its waiter; the caller
// forgets it (Handler.forget) when done.
func (h *Handler) newAttempt(ctx context.Context, tr Transport, log *slog.Logger, job *consumer.Job, c Command) *attempt {
	a := &attempt{
		h: h, ctx: ctx, job: job, tr: tr, log: log, cmd: c,
		msg: CommandMessage{
			TaskKey:       job.Task.Key,
			Attempt:       job.Attempt,
			CorrelationID: NewCorrelationID(),
			Command:       c.Command,
			Args:          c.Args,
		},
		topic:         h.topics.Device(c.Device, TopicCmd),
		published:     job.Task.CreatedAt,
		ackTimeout:    time.Duration(c.AckTimeout),
		resultTimeout: time.Duration(c.ResultTimeout),
	}
	a.msg.Traceparent, a.msg.Tracestate = tracing.Inject(ctx)
	a.linkWait = max(a.resultTimeout, minLinkWait)
	a.w = &waiter{device: c.Device, taskKey: a.msg.TaskKey, attempt: a.msg.Attempt, replies: make(chan reply, 16)}
	h.listen(a.msg.CorrelationID, a.w)
	return a
}

// errorf formats an error of this attempt: "task <key> attempt <n>" and
// then format, which starts with ":" or " on <device>:".
func (a *attempt) errorf(format string, args ...any) error {
	return fmt.Errorf("task %s attempt %d"+format, append([]any{a.msg.TaskKey, a.msg.Attempt}, args...)...)
}

// cancelled is the attempt's end when its context ends (lease lost).
func (a *attempt) cancelled() error { return a.errorf(": %w", context.Cause(a.ctx)) }

// snooze gives the attempt back, retry unspent: the device is still away,
// and Ready holds the command, writing nothing, until it is back.
func (a *attempt) snooze() error { return consumer.Snooze(offlineSnooze) }

// publish sends a copy of the command, valid for one ack timeout.
func (a *attempt) publish() error {
	a.pubLosses, a.pubDown, _ = a.h.link()
	a.msg.SentAt = time.Now().UTC()
	a.msg.ExpiresAt = a.msg.SentAt.Add(a.ackTimeout)
	b, err := Encode(a.msg)
	if err != nil {
		return a.errorf(": publish: %w", err)
	}
	pctx, cancel := context.WithTimeout(a.ctx, a.ackTimeout)
	defer cancel()
	err = a.tr.Publish(pctx, a.topic, false, b)
	if err != nil && a.ctx.Err() == nil {
		// Not connected: paho keeps it queued; the ack wait decides.
		a.log.Warn("command publish not confirmed", slog.Any("error", err))
		return nil
	}
	if err != nil {
		return a.errorf(": publish: %w", err)
	}
	a.job.Logf("device %s: command %s sent", a.cmd.Device, a.cmd.Command)
	tracing.Event(a.ctx, "device.command", tracing.String("leasepool.device.id", a.cmd.Device),
		tracing.String("leasepool.device.command", a.cmd.Command), tracing.String("leasepool.device.correlation_id", a.msg.CorrelationID))
	return nil
}

// onReply handles an ack or result of this attempt; it reports whether
// the ack phase is over, and the refusal if any.
func (a *attempt) onReply(rp reply) (bool, error) {
	if !rp.r.OK && rp.kind == TopicAck {
		if rp.r.Code == CodeExpired {
			return false, nil // an earlier copy; a later one may be live
		}
		return true, a.errorf(" on %s: %w: %s", a.cmd.Device, ErrRefused, rp.r.Error)
	}
	a.acked = true
	if rp.kind == TopicResult { // its ack was lost
		r := rp.r
		a.result = &r
	}
	return true, nil
}

// awaitAck is the ack phase: publish, wait, publish again while no ack
// comes, up to max_publishes copies.
//
// When the device drops offline meanwhile, stop publishing and wait out the
// current copy's expiry: a device refuses an expired command. That is not
// enough to give the attempt back, though: a copy may have been accepted
// in time with its ack lost or still on its way (the ack is queued in our
// session while we reconnect after a broker restart, and the broker sends
// the devices' wills when it stops). A snooze then would free the device
// lock while the device runs the command, and the next holder's command
// would arrive behind it. So once a copy has been published and the device
// was seen offline, hold the attempt until the device is back and ask it
// again (a republish: a duplicate for the device if it had accepted,
// answered with its ack and, when done, its result), and snooze only when
// the device stays away for result_timeout.
func (a *attempt) awaitAck() error {
	tracker, dev := a.h.tracker, a.cmd.Device
	for n := 1; !a.acked; n++ {
		offline := tracker.Changed(dev)
		if tracker.Offline(dev) {
			if n == 1 { // nothing sent yet
				if err := offlineTooLong(a.cmd, a.published); err != nil {
					return a.errorf(" on %s: %w", dev, err)
				}
				a.log.Info("device offline: snooze")
				return a.snooze()
			}
			if end, err := a.awaitBack(); err != nil || end { // end: acked meanwhile
				return err
			}
			offline = tracker.Changed(dev)
		}
		a.log.Debug("publish command", slog.Int("publish", n))
		if err := a.publish(); err != nil {
			return err
		}
		spent, err := a.awaitCopy(n, offline)
		if err != nil {
			return err
		}
		if !spent {
			n-- // asking again after an outage spends no publish
		}
	}
	return nil
}

// awaitCopy waits for the reply to the n-th copy, watching the device's
// state through offline. It reports whether the copy counts against
// max_publishes.
func (a *attempt) awaitCopy(n int, offline <-chan struct{}) (spent bool, err error) {
	timer := time.NewTimer(a.ackTimeout)
	defer timer.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return true, a.cancelled()
		case <-offline:
			offline = a.h.tracker.Changed(a.cmd.Device)
			a.offlineSeen = a.offlineSeen || a.h.tracker.Offline(a.cmd.Device)
		case rp := <-a.w.replies:
			if end, err := a.onReply(rp); end {
				return true, err
			}
		case <-timer.C:
			return a.copyExpired(n)
		}
	}
}

// copyExpired decides what follows a copy that got no ack in time.
func (a *attempt) copyExpired(n int) (spent bool, err error) {
	if losses, down, _ := a.h.link(); losses != a.pubLosses || a.pubDown || down {
		// Our connection dropped while this copy waited: it may never
		// have reached the device, or its ack never reached us. Asking
		// again spends no publish.
		a.log.Info("own MQTT connection dropped before ack: asking again once connected")
		if down {
			if _, err := a.awaitLink(); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	if a.offlineSeen || a.h.tracker.Offline(a.cmd.Device) {
		// The copy has expired; the device may still have accepted it:
		// hold on until it is back and ask again.
		a.log.Info("device went offline before ack: waiting for it to ask again")
		a.offlineSeen = false
		end, err := a.awaitBack()
		return end, err
	}
	if n >= a.cmd.MaxPublishes {
		return true, a.errorf(" on %s: %w after %d publishes of %s", a.cmd.Device, ErrNoAck, n, a.ackTimeout)
	}
	return true, nil
}

// awaitBack runs after a copy expired with the device seen offline: it
// returns (false, nil) once the device is online (publish again), or the
// attempt's end: a reply, the snooze after result_timeout away, ctx.
func (a *attempt) awaitBack() (bool, error) {
	if a.awayUntil.IsZero() {
		a.awayUntil = time.Now().Add(a.resultTimeout)
	}
	away := func() (<-chan struct{}, bool) {
		changed := a.h.tracker.Changed(a.cmd.Device)
		return changed, a.h.tracker.Offline(a.cmd.Device)
	}
	return a.hold(away, time.Until(a.awayUntil), "device away since a command went out: snooze", a.resultTimeout)
}

// awaitLink runs when our own connection dropped while a copy waited for
// its ack (the broker died or moved: its wills were never sent, so the
// device may look online): hold the attempt until we are connected again,
// then publish again. Only a link down for linkWait gives the attempt back.
func (a *attempt) awaitLink() (bool, error) {
	down := func() (<-chan struct{}, bool) {
		_, down, reconnected := a.h.link()
		return reconnected, down
	}
	return a.hold(down, a.linkWait, "own MQTT connection down since a command went out: snooze", a.linkWait)
}

// hold keeps the attempt, and so its device lock, while blocked says so
// (its channel closes at the next change): it returns (false, nil) once
// blocked no longer holds, or the attempt's end: a reply, ctx, or a snooze
// (logged as giveUp, having waited) when blocked still holds after d.
func (a *attempt) hold(blocked func() (<-chan struct{}, bool), d time.Duration, giveUp string, waited time.Duration) (bool, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		changed, still := blocked()
		if !still {
			return false, nil
		}
		select {
		case <-a.ctx.Done():
			return true, a.cancelled()
		case <-changed:
		case rp := <-a.w.replies:
			if end, err := a.onReply(rp); end {
				return true, err
			}
		case <-timer.C:
			a.log.Info(giveUp, slog.Duration("waited", waited))
			return true, a.snooze()
		}
	}
}

// awaitResult is the result phase. After a reconnect of ours the result
// may have been published while we were away (and lost if the broker
// restarted): publish the command again; the device answers a duplicate
// with its cached ack and result instead of running it twice.
//
// The device may reconnect after us (a broker that moved to another host):
// a copy published at once can miss it, so after a reconnect the command
// is asked again every ack_timeout until the result comes, and the result
// timeout starts again (time without a connection does not count against
// the device).
func (a *attempt) awaitResult() error {
	if a.result != nil {
		return nil
	}
	timer := time.NewTimer(a.resultTimeout)
	defer timer.Stop()
	var reask *time.Ticker
	defer func() {
		if reask != nil {
			reask.Stop()
		}
	}()
	var reaskC <-chan time.Time
	extended := false
	for a.result == nil {
		_, _, reconnected := a.h.link()
		select {
		case <-a.ctx.Done():
			return a.cancelled()
		case <-reconnected:
			a.log.Info("reconnected: publish command again for its result")
			if err := a.publish(); err != nil {
				return err
			}
			timer.Reset(a.resultTimeout)
			if reask == nil {
				reask = time.NewTicker(a.ackTimeout)
				reaskC = reask.C
			}
		case <-reaskC:
			a.log.Debug("no result since reconnect: publish command again")
			if err := a.publish(); err != nil {
				return err
			}
		case rp := <-a.w.replies:
			if rp.kind == TopicResult {
				r := rp.r
				a.result = &r
			}
		case <-timer.C:
			if _, down, _ := a.h.link(); down && !extended {
				// Disconnected: wait for the link (the reconnect restarts
				// the result timeout), within bounds.
				extended = true
				timer.Reset(a.linkWait)
				continue
			}
			return a.errorf(" on %s: %w after %s", a.cmd.Device, ErrResultTimeout, a.resultTimeout)
		}
	}
	return nil
}
