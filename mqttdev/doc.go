// Package mqttdev drives IoT devices over MQTT for the leasepool task queue:
// a consumer.Handler that sends a device task's command and waits for the
// device's answer, the publish helper that makes such tasks, a tracker of
// device online state, and Wire, which sets a worker process up for device
// tasks. The device side lives in its own packages: mqttdev/device (a
// device simulator) and mqttdev/broker (an embedded broker and its hosting
// lease). Both sides import mqttdev/protocol, the topics, messages and MQTT
// client transport they share; mqttdev re-exports its names.
//
// Every long-lived component here (Handler, StateTracker, the simulator,
// the broker and its host) has Start(ctx), which ctx bounds and which
// returns an error when called twice, and Stop(ctx), which may be called
// again and waits for the component's goroutines while ctx lasts.
//
// A device task (kind "device", see PublishParams) carries the lock key
// device:<id>, so the claim lets one command per device run cluster-wide;
// the next waits in priority, then publish order. The attempt number of
// the claim is the fencing token carried on every command.
//
// # Protocol
//
// Every topic is <prefix>/devices/<id>/<kind>. The prefix (default
// "leasepool") and the device id are each exactly one topic level:
// ValidateID refuses empty strings, "." and "..", "+", "#", "/", white
// space, NUL and other control characters, format characters (the
// bidirectional overrides U+202E and kin), invalid UTF-8, and more than
// 128 bytes; a message on the topic of a refused id is ignored. All
// messages are JSON objects of at most 1 MiB, published at QoS 1. Unknown
// fields are ignored.
//
// <prefix>/devices/<id>/cmd, worker to device, not retained:
//
//	{"task_key":"reboot-pump-7","attempt":3,"correlation_id":"9f2c...e1",
//	 "command":"reboot","args":{"delay_s":5},"sent_at":"2026-01-02T03:04:05Z",
//	 "expires_at":"2026-01-02T03:04:10Z"}
//
// A fresh correlation_id is made per attempt; republishes of one attempt
// (when no ack came in time) reuse it. args is a JSON object or absent.
// expires_at (sent_at + ack_timeout) is when the worker stops waiting for
// this copy's ack: a device refuses a command it receives later (one queued
// in its session while it was offline), so a command given up on never
// runs behind the next holder of the device lock. Device and worker clocks
// must agree to well within ack_timeout (NTP).
//
// <prefix>/devices/<id>/ack, device to worker, not retained: sent when the
// device accepts a command (ok true) or refuses it (ok false, error says
// why):
//
//	{"correlation_id":"9f2c...e1","task_key":"reboot-pump-7","attempt":3,"ok":true}
//	{"correlation_id":"77ab...03","task_key":"reboot-pump-7","attempt":2,"ok":false,
//	 "code":"stale_attempt","error":"stale attempt 2 < 3"}
//	{"correlation_id":"9f2c...e1","task_key":"reboot-pump-7","attempt":3,"ok":false,
//	 "code":"expired","error":"expired at 2026-01-02T03:04:10Z"}
//
// <prefix>/devices/<id>/result, device to worker, not retained: sent when
// the command has run; output is any JSON value:
//
//	{"correlation_id":"9f2c...e1","task_key":"reboot-pump-7","attempt":3,"ok":true,
//	 "output":{"uptime_s":2}}
//	{"correlation_id":"9f2c...e1","task_key":"reboot-pump-7","attempt":3,"ok":false,
//	 "error":"relay stuck"}
//
// <prefix>/devices/<id>/status, device to everyone, retained:
//
//	{"online":true,"at":"2026-01-02T03:04:05Z"}
//	{"online":true,"at":"2026-01-02T03:04:05Z",
//	 "attributes":{"model":"pump-x","firmware":"1.4.2","site":"berlin"}}
//	{"online":false,"at":"2026-01-02T03:00:00Z"}
//
// attributes (optional, in online statuses) are what the device announces
// of itself: at most 32 keys of letters, digits, '.', '_', '-' (63 bytes),
// values of letters, digits and ". _ - : / @ +" (128 bytes). Workers keep
// them in the device inventory (InventoryNamespace), apart from the labels
// an operator sets: whoever can publish a device's status sets its
// attributes, so a selector reads them only in attr: terms, and a device
// is new, taken by no rollout, until someone vouches for it (Vouch). A
// status whose attributes break these rules keeps its online state and
// its attributes are dropped, with a warning.
//
// A device connects with a persistent session (clean session off, a stable
// client id) and sets the offline message as its MQTT last will; on every
// connection it subscribes to its cmd topic and publishes online; it
// republishes online every heartbeat period; before a clean disconnect it
// publishes offline itself (a clean disconnect suppresses the will). In a
// will, at is when the will was set, not when the device dropped.
//
// Device rules:
//
//   - Commands run one at a time.
//   - For each task key the device remembers the highest attempt seen. A
//     command with a lower attempt is not run; the device answers with an
//     ack, ok false, error "stale attempt N < M".
//   - A command received after its expires_at, and not already accepted,
//     is not run: ack ok false, code "expired".
//   - A command whose task key and attempt it has already accepted is a
//     duplicate (a republish): the device does not run it again, it sends
//     the ack again and, if the command has finished, the result again.
//   - Replies echo correlation_id, task_key and attempt.
//
// Worker rules (Handler):
//
//   - A device whose last status is offline is not sent anything: its
//     commands are held in each worker before any claim (Handler.Ready, a
//     consumer.Gate), with no store write, until the device's online
//     status (every worker hears it) or the OfflineRecheck fallback. A
//     claim that raced the offline status is given back with a 1 s
//     snooze, spending no retry, and held from then on; a flow step's
//     command is judged by what is inside its envelope, and a task with a
//     running attempt is let through (its dead holder's lease is taken
//     over or its failure recorded). A
//     device never heard of is sent the command (its persistent session
//     queues it).
//   - The command is published, then the worker waits ack_timeout for the
//     ack, publishing again up to max_publishes times in all. A result
//     arriving first counts as the ack too; an "expired" refusal of an
//     earlier copy is ignored. No ack at all fails the attempt (ErrNoAck).
//     If the device goes offline meanwhile, publishing stops until the
//     last copy has expired. The attempt is not given back then: a copy
//     may have been accepted with its ack lost (or queued in the worker's
//     session while it reconnects), and a snooze would free the device
//     lock while the device runs it. The worker holds the attempt until
//     the device is back and publishes again (a duplicate if it had
//     accepted, answered with its ack and result), spending no publish;
//     only when the device stays offline for result_timeout is the
//     attempt snoozed.
//   - After the ack it waits result_timeout for the result: ok true is
//     success; ok false (ErrDeviceFailed), an ack with ok false
//     (ErrRefused) and no result in time (ErrResultTimeout) fail the
//     attempt, and the task's retry rules apply.
//   - After a reconnect of its own, the worker publishes the command again
//     (same correlation id) so that a result lost with a restarted broker
//     is sent again from the device's cache.
//   - Replies whose correlation id, task key, attempt or device do not
//     match the waiting attempt are ignored.
//   - When the lease is lost the handler's context is cancelled and Handle
//     returns at once with its cause.
//
// # Embedded broker and its takeover
//
// broker.Listen runs an embedded broker (mochi-mqtt, loopback only, sessions
// and retained messages in memory). It lets in only devices and workers
// with a credential (broker.Config.Credentials; package mqttdev/credential
// keeps them in the store: a secret's hash per device, and the cluster's
// worker secret that Wire logs workers in with), each kept to its own
// topics, unless told to allow anonymous clients. For a group of worker processes on one
// host sharing a store, broker.Host keeps one running on a fixed address
// even when the process running it dies: hosting is a singleton
// (internal/singleton, as the flow reconciler and retention are), a lease
// in the store's lock table (namespace task.LockSingleton, key
// broker.LockKey(addr), e.g.
// "mqtt-broker:127.0.0.1:1883"; holder the worker id and process instance),
// renewed every third of the lease (default broker.DefaultLease, 3s). Every
// process runs a broker.Host (Start, Stop); the holder hosts; the others
// take the lease once it runs out (they sleep until the holder's lease
// ends) and start the broker on the same address, retrying the bind every
// 100ms while the old socket is released. A holder that cannot renew before
// its lease, less a tenth, runs out, or finds the lease taken, closes its
// broker; a new holder is granted the lease only after the old lease ended,
// so two brokers never serve at once (a host frozen past its lease still
// holds the port: the new holder's binds fail until the old one wakes,
// sees the lost lease and closes). Stop closes the broker and releases the
// lease, so the next host starts within a third of a lease.
//
// A takeover loses the broker's sessions, retained statuses and queued
// messages; clients of this package find the new broker within 500ms
// (their reconnect interval), subscribe again on every connection, devices
// publish their status again, and replies a client queued while
// disconnected are sent once it is back. The handler treats its own lost
// connection like a device outage, without spending publishes or retries:
//
//   - a copy whose ack wait saw the handler's connection drop spends no
//     publish; while the connection is down the attempt is held (the device
//     lock kept) until it is back, then the command is published again; only
//     a connection down for max(result_timeout, 10s) snoozes the attempt;
//   - after a reconnect while waiting for the result, the command is
//     published again every ack_timeout until the result comes (the device
//     may reconnect after the handler and miss the first copy; it answers
//     duplicates from its cache), and result_timeout starts again;
//   - a result timeout that fires while disconnected waits once more, up to
//     max(result_timeout, 10s), for the connection.
//
// Wiring a worker, with the embedded broker hosted by turns among the
// workers sharing the store (or Client.BrokerURL set to use another):
//
//	w, err := mqttdev.Wire(ctx, mqttdev.WireConfig{
//		Mux: mux, Store: store, WorkerID: workerID, Logger: logger,
//	})                             // before the consumer starts
//	... run the consumer ...
//	err = w.Stop(ctx)              // after the consumer has stopped
//
// or by hand, with a broker of one's own:
//
//	h, err := mqttdev.NewHandler(mqttdev.HandlerConfig{
//		ClientConfig: mqttdev.ClientConfig{BrokerURL: "tcp://broker:1883", ClientID: workerID},
//		Logger:       logger,
//	})
//	err = h.Start(ctx)             // before the consumer starts
//	mux.Register(mqttdev.Kind, h)
//	... run the consumer ...
//	err = h.Stop(ctx)              // after the consumer has stopped
package mqttdev
