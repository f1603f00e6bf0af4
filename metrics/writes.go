package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WriteCounts are an embedded store's counts of its write transactions
// and of its use of the file's write lock, field for field
// sqlitestore.WriteStats (convertible to it).
type WriteCounts struct {
	Commits, Writes           int64
	LockWait, LockHeld        time.Duration
	Begin, Statements, Commit time.Duration
}

// StoreWrites exports an embedded store's write transactions and its use
// of the file's write lock (sqlitestore.Store.WriteStats): the group
// commit's batch size is writes over commits, and the lock's held time,
// summed over every process on one file, says how busy the lock is. Near
// one second per second, every write on the host waits for the lock, and
// another process on the file adds no throughput.
type StoreWrites struct {
	stats                              func() WriteCounts
	commits, writes, wait, held, phase *prometheus.Desc
}

// NewStoreWrites exports what stats returns (usually the Store's
// WriteStats, converted) at each scrape.
func NewStoreWrites(stats func() WriteCounts) *StoreWrites {
	return &StoreWrites{
		stats: stats,
		commits: prometheus.NewDesc(namespace+"_store_commits_total",
			"Embedded store only: write transactions this process committed.", nil, nil),
		writes: prometheus.NewDesc(namespace+"_store_committed_writes_total",
			"Embedded store only: write requests those transactions carried (writes per commit is this over the commits).", nil, nil),
		wait: prometheus.NewDesc(namespace+"_store_write_lock_wait_seconds_total",
			"Embedded store only: time this process waited for the file's write lock.", nil, nil),
		held: prometheus.NewDesc(namespace+"_store_write_lock_held_seconds_total",
			"Embedded store only: time this process held the file's write lock, which one process at a time holds.", nil, nil),
		phase: prometheus.NewDesc(namespace+"_store_write_phase_seconds_total",
			"Embedded store only: time this process's write transactions spent, holding the write lock, starting (begin: after another process's commit the page cache is read again), running their statements (statements), and committing (commit).", []string{"phase"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (w *StoreWrites) Describe(ch chan<- *prometheus.Desc) {
	ch <- w.commits
	ch <- w.writes
	ch <- w.wait
	ch <- w.held
	ch <- w.phase
}

// Collect implements prometheus.Collector.
func (w *StoreWrites) Collect(ch chan<- prometheus.Metric) {
	st := w.stats()
	ch <- prometheus.MustNewConstMetric(w.commits, prometheus.CounterValue, float64(st.Commits))
	ch <- prometheus.MustNewConstMetric(w.writes, prometheus.CounterValue, float64(st.Writes))
	ch <- prometheus.MustNewConstMetric(w.wait, prometheus.CounterValue, st.LockWait.Seconds())
	ch <- prometheus.MustNewConstMetric(w.held, prometheus.CounterValue, st.LockHeld.Seconds())
	ch <- prometheus.MustNewConstMetric(w.phase, prometheus.CounterValue, st.Begin.Seconds(), "begin")
	ch <- prometheus.MustNewConstMetric(w.phase, prometheus.CounterValue, st.Statements.Seconds(), "statements")
	ch <- prometheus.MustNewConstMetric(w.phase, prometheus.CounterValue, st.Commit.Seconds(), "commit")
}
