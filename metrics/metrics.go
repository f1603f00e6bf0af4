// Package metrics exports leasepool's Prometheus metrics: what a worker
// does (claims, outcomes, handler durations, waits, claim conflicts,
// device commands), recorded through the consumer's and the device
// handler's observer hooks, and what the store holds (tasks per state and
// kind, the oldest ready task's age, live workers), read by a collector
// that caches the store's figures so scrapes stay cheap.
//
// Wiring a worker:
//
//	reg := prometheus.NewRegistry()
//	m, _ := metrics.New(reg)
//	c, _ := consumer.New(consumer.Config{..., Observer: m})
//	http.Handle("/metrics", metrics.Handler(reg, ""))
package metrics

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/mqttdev"
)

const namespace = "leasepool"

// Buckets of the duration histograms: 5 ms to about 20 min, since tasks
// range from no-ops to long device exchanges and exec programs.
var durationBuckets = prometheus.ExponentialBuckets(0.005, 4, 10)

// Metrics records a worker's activity. It implements consumer.Observer and
// mqttdev.CommandObserver; give it to consumer.Config.Observer and
// mqttdev.WireConfig.Observer.
type Metrics struct {
	claimed     *prometheus.CounterVec
	finished    *prometheus.CounterVec
	takenOver   *prometheus.CounterVec
	conflicts   *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	wait        *prometheus.HistogramVec
	commands    *prometheus.CounterVec
	commandTrip prometheus.Histogram
	// Per group (tenant), for grouped tasks only.
	groupClaimed *prometheus.CounterVec
	groupRunning *prometheus.GaugeVec
}

var (
	_ consumer.Observer       = (*Metrics)(nil)
	_ mqttdev.CommandObserver = (*Metrics)(nil)
)

// New makes the worker metrics and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tasks_claimed_total",
			Help: "Claims this worker wrote (attempts started or about to start).",
		}, []string{"kind"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tasks_finished_total",
			Help: "Attempts this worker ended, by the outcome written: succeeded, retried, failed (retries exhausted), " +
				"snoozed, released, lease_lost, cancelled, task_done, not_written.",
		}, []string{"kind", "outcome"}),
		takenOver: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "tasks_taken_over_total",
			Help: "Expired leases (crashed or frozen holders) that this worker's claims recorded as failed and replaced.",
		}, []string{"kind"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "claim_conflicts_total",
			Help: "Compare-and-set conflicts met by this worker's claims (another writer changed the task first).",
		}, []string{"kind"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "handler_duration_seconds",
			Help:    "How long handlers ran, by the attempt's outcome.",
			Buckets: durationBuckets,
		}, []string{"kind", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "task_wait_seconds",
			Help:    "Publish-to-start wait: claim time minus the latest of the task's created_at, run_at and the end of an expired lease taken over (store clock).",
			Buckets: durationBuckets,
		}, []string{"kind"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "device_commands_total",
			Help: "Device command attempts by outcome: ok, device_failed, refused, no_ack, result_timeout, offline, cancelled, error.",
		}, []string{"outcome"}),
		commandTrip: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "device_command_round_trip_seconds",
			Help:    "From the start of a device command attempt to the device's result (ok or device_failed).",
			Buckets: durationBuckets,
		}),
		groupClaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "group_tasks_claimed_total",
			Help: "Claims this worker wrote of grouped tasks, by group: the groups' shares of the workers (weights).",
		}, []string{"group"}),
		groupRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "group_tasks_running",
			Help: "Attempts of grouped tasks this worker runs now, by group: summed over workers, at most the group's concurrency limit.",
		}, []string{"group"}),
	}
	for _, c := range []prometheus.Collector{m.claimed, m.finished, m.takenOver, m.conflicts, m.duration, m.wait, m.commands, m.commandTrip, m.groupClaimed, m.groupRunning} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Claimed implements consumer.Observer.
func (m *Metrics) Claimed(e consumer.ClaimEvent) {
	m.claimed.WithLabelValues(e.Kind).Inc()
	m.wait.WithLabelValues(e.Kind).Observe(e.Wait.Seconds())
	if e.Group != "" {
		m.groupClaimed.WithLabelValues(e.Group).Inc()
		m.groupRunning.WithLabelValues(e.Group).Inc()
	}
	if e.TakenOver > 0 {
		m.takenOver.WithLabelValues(e.Kind).Add(float64(e.TakenOver))
	}
}

// ClaimConflict implements consumer.Observer.
func (m *Metrics) ClaimConflict(kind string) { m.conflicts.WithLabelValues(kind).Inc() }

// Finished implements consumer.Observer.
func (m *Metrics) Finished(e consumer.FinishEvent) {
	m.finished.WithLabelValues(e.Kind, string(e.Outcome)).Inc()
	if e.Group != "" {
		m.groupRunning.WithLabelValues(e.Group).Dec()
	}
	if e.Started {
		m.duration.WithLabelValues(e.Kind, string(e.Outcome)).Observe(e.Duration.Seconds())
	}
}

// CommandDone implements mqttdev.CommandObserver.
func (m *Metrics) CommandDone(e mqttdev.CommandEvent) {
	m.commands.WithLabelValues(string(e.Outcome)).Inc()
	if e.Outcome.RoundTrip() {
		m.commandTrip.Observe(e.Duration.Seconds())
	}
}

// Handler serves g's metrics in the Prometheus exposition format. A
// non-empty token is required as "Authorization: Bearer TOKEN" (401
// otherwise), as on the rest of leasepool serve.
func Handler(g prometheus.Gatherer, token string) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	if token == "" {
		return h
	}
	// Both sides hashed: the constant-time compare then hides the token's
	// length too.
	want := sha256.Sum256([]byte("Bearer " + token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(strings.TrimSpace(r.Header.Get("Authorization"))))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leasepool"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
