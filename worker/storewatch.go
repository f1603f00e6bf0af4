package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

// watchStore checks the store every so often and sends one error to out
// once it has kept failing for longer than bound: reading the worker
// registry fails, or this worker's registration (instance) is not there or
// has lapsed, so the heartbeat cannot write. A worker in that state runs
// nothing and logs warnings for ever; a new process opens the store afresh
// (an embedded store whose -wal file was deleted works again then).
func watchStore(ctx context.Context, p storeProbe, bound time.Duration, out chan<- error) {
	every := min(max(bound/10, 100*time.Millisecond), 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	var since time.Time // when the store was first seen failing; zero: healthy
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := p.check(ctx, min(bound, 10*time.Second))
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > bound:
			out <- fmt.Errorf("%w for %s (StoreFailTimeout %s): %w", ErrStoreFailing,
				time.Since(since).Round(time.Second), bound, err)
			return
		}
	}
}

// storeProbe is what watchStore checks.
type storeProbe struct {
	s                  task.Store
	workerID, instance string
	// file is the embedded store's file; "" for other stores.
	file string
	// registration is what the consumer's heartbeat last learned of this
	// worker's registration; false when it does not read the registry,
	// and the probe reads it itself.
	registration func() (consumer.Registration, bool)
}

// check checks this worker's registration is live and was renewed by the
// last heartbeat, and that none of an embedded store's files this process
// holds open was deleted or replaced: its writes then reach no other
// process, though they succeed. The heartbeat reads the registry after
// each renewal, so the probe reads it only when the consumer does not:
// one read per worker and heartbeat, however often the probe looks.
func (p storeProbe) check(ctx context.Context, timeout time.Duration) error {
	if name := deletedOpenFile(p.file); name != "" {
		return fmt.Errorf("the embedded store's file %s was deleted or replaced while open", name)
	}
	if p.registration != nil {
		if reg, ok := p.registration(); ok {
			if reg.Err != nil {
				return reg.Err
			}
			return p.live(reg.Self)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, err := p.s.Workers(ctx)
	if err != nil {
		return fmt.Errorf("read the worker registry: %w", err)
	}
	for i, w := range ws {
		if w.ID == p.workerID && w.Instance == p.instance {
			return p.live(&ws[i])
		}
	}
	return p.live(nil)
}

// live checks self, this worker's record as the registry listed it (nil:
// not listed), holds now.
func (p storeProbe) live(self *task.WorkerInfo) error {
	switch {
	case self == nil:
		return fmt.Errorf("worker %s (instance %s) is not in the registry", p.workerID, p.instance)
	case !self.Live(p.s.Now()):
		return fmt.Errorf("registration of worker %s not renewed since %s", p.workerID, self.Heartbeat.Format(time.RFC3339))
	}
	return nil
}

// procPath is file as /proc/self/fd names it once open: absolute, with its
// symbolic links resolved (those of its directory when it does not exist
// yet). A path left as given would never match, and a deleted file would
// go unseen.
func procPath(file string) string {
	if file == "" {
		return ""
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return file
	}
	if p, err := filepath.EvalSymlinks(abs); err == nil {
		return p
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(dir, filepath.Base(abs))
	}
	return abs
}

// deletedOpenFile returns the name of a file of the embedded store at
// file (itself, its -wal, -shm or -lock) that this process holds open
// although it was deleted, as Linux's /proc/self/fd tells; "" if none or
// where there is no /proc. file must be absolute with its directory's
// symbolic links resolved, as /proc shows it.
func deletedOpenFile(file string) string {
	if file == "" {
		return ""
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return ""
	}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil {
			continue
		}
		name, deleted := strings.CutSuffix(target, " (deleted)")
		if !deleted {
			continue
		}
		if rest, ok := strings.CutPrefix(name, file); ok && slices.Contains([]string{"", "-wal", "-shm", "-lock"}, rest) {
			return name
		}
	}
	return ""
}
