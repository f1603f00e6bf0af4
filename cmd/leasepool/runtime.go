package main

import (
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// This file holds the two runtime settings leasepool's own processes
// change, each only when the user has not set it in the environment.

// gcPercent is the garbage collector's GOGC for every leasepool command
// while its live heap is small. A worker's live heap is small (about 10
// MiB: the claim heap, caches, the running tasks) while it allocates a
// document or two per write, so at the default of 100 the collector ran
// every few milliseconds under load, and its mark workers and assists
// took a P from a saturated worker. One worker process draining 20,000
// noop tasks on 2 cores (five runs each, alternating): median 11,900/s at
// 100, 14,500/s at 200, 15,100/s at 400; its peak RSS went from 45 to
// 67-72 MiB at 400, idle RSS unchanged (23 MiB).
const gcPercent = 400

// gcHeadroom bounds the garbage a process lets pile up between
// collections once its live heap is larger: at 400 % a worker driving a
// 100,000-device rollout (a live heap of 25-30 MiB) grew to 150 MiB of
// resident memory, most of it garbage awaiting the next collection.
const gcHeadroom = 64 << 20

// gcPercentFor is the GC percent for a live heap of live bytes: gcPercent
// while 4 × live is within gcHeadroom, then what keeps the garbage within
// gcHeadroom, never below Go's default of 100.
func gcPercentFor(live uint64) int {
	if live == 0 {
		return gcPercent
	}
	return int(min(max(gcHeadroom*100/live, 100), gcPercent))
}

var followLive sync.Once

// tuneGC sets gcPercent unless GOGC is set, and from then on follows the
// live heap (gcPercentFor), once a second.
func tuneGC() {
	if os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
	followLive.Do(func() { go followLiveHeap(time.Second) })
}

// followLiveHeap sets the GC percent for the live heap every interval.
func followLiveHeap(interval time.Duration) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	set := gcPercent
	for range time.Tick(interval) {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindUint64 {
			return // not measured by this runtime: keep gcPercent
		}
		if p := gcPercentFor(sample[0].Value.Uint64()); p != set {
			debug.SetGCPercent(p)
			set = p
		}
	}
}

var raiseProcs sync.Once

// embeddedProcs gives a process that writes an embedded store two more Ps
// than the Go default (one a core), unless GOMAXPROCS is set. SQLite there
// is Go translated from C: its file syscalls (some forty pwrites a commit)
// keep their P, too short for the runtime to hand it on, so the store's
// writer and checkpointer held back goroutines ready to run while a core
// sat in the kernel. A worker process on 2 cores drained 20,000 noop
// tasks at a median 13,000/s with 4 Ps against 11,000/s with 2 (six runs
// each, alternating); publish-to-start p99 across processes went from
// 0.7-1.0 ms to 1.1-1.4 ms.
func embeddedProcs() {
	raiseProcs.Do(func() {
		procs := runtime.GOMAXPROCS(0)
		if n := embeddedProcsFor(os.Getenv("GOMAXPROCS"), procs); n != procs {
			runtime.GOMAXPROCS(n)
			slog.Debug("embedded store: GOMAXPROCS raised", slog.Int("procs", n))
		}
	})
}

// embeddedProcsFor is embeddedProcs' choice given the GOMAXPROCS
// environment variable and the current setting: a value the user chose
// stands.
func embeddedProcsFor(env string, procs int) int {
	if env != "" {
		return procs
	}
	return procs + 2
}
