// Which client ids each identity may use, and the removal of a revoked
// identity's persisted sessions.

package broker

import (
	"log/slog"
	"strings"
	"time"

	mqtt "github.com/leasepool/leasepool/internal/mochi"
)

// Client id prefixes that name their owner (see ClientIDOwner).
const (
	// WorkerClientIDPrefix starts the client ids of a worker:
	// "leasepool-worker-<worker id>".
	WorkerClientIDPrefix = "leasepool-worker-"
	// SimClientIDPrefix starts the client ids of a simulated device:
	// "leasepool-sim-<device id>".
	SimClientIDPrefix = "leasepool-sim-"
)

// ClientIDOwner returns the user name (a device id, or WorkerUserPrefix
// and a worker id) that the embedded broker lets use clientID. The part
// before the first "/" names the owner:
//
//	leasepool-worker-<w>[/...]   worker w
//	leasepool-sim-<d>[/...]      device d
//	<d>[/...]                    device d
//
// A client id is a session's name, and a session carries subscriptions,
// queued messages and a will: were client ids first come, first served,
// any device could take over another client's session, or hold a
// worker's predictable id before the worker connects and lock it out.
// Binding each id to one identity makes both impossible.
func ClientIDOwner(clientID string) string {
	base, _, _ := strings.Cut(clientID, "/")
	if w, ok := strings.CutPrefix(base, WorkerClientIDPrefix); ok {
		return WorkerUserPrefix + w
	}
	if d, ok := strings.CutPrefix(base, SimClientIDPrefix); ok {
		return d
	}
	return base
}

// removeSession drops the persisted session of a disconnected client:
// its subscriptions and queued messages, and its place in the server, so
// that it neither collects messages nor holds its client id any more. A
// client that connected again under the id meanwhile is left alone.
func (h *authHook) removeSession(cl *mqtt.Client) bool {
	cur, ok := h.srv.Clients.Get(cl.ID)
	if !ok || cur != cl || cl.StopTime() == 0 {
		return false
	}
	h.srv.UnsubscribeClient(cl)
	cl.ClearInflights()
	h.srv.Clients.Delete(cl.ID)
	return true
}

// sweepSessions removes the sessions, persisted or just disconnected, of
// the identities whose credential is gone from devices (a worker's, when
// the worker secret is), and forgets the logins of the sessions the
// server no longer keeps. A rotated credential keeps its sessions: they
// are still its identity's. Sessions from logins after start are left to
// the next sweep, as refresh leaves their connections.
func (h *authHook) sweepSessions(start time.Time, devices map[string][32]byte, workerFound bool) {
	var revoked []*mqtt.Client
	h.mu.Lock()
	for id, s := range h.owners {
		if !s.at.Before(start) {
			continue
		}
		cl, ok := h.srv.Clients.Get(id)
		if !ok {
			delete(h.owners, id)
			continue
		}
		_, found := devices[s.id]
		if s.worker {
			found = s.cert || workerFound
		}
		if !found {
			revoked = append(revoked, cl)
		}
	}
	h.mu.Unlock()
	for _, cl := range revoked {
		if !h.removeSession(cl) {
			continue // still connected: refresh disconnects it, the next sweep removes it
		}
		h.mu.Lock()
		if s := h.owners[cl.ID]; s != nil && s.at.Before(start) {
			delete(h.owners, cl.ID)
		}
		h.mu.Unlock()
		h.log.Warn("MQTT session removed: its identity's credential was revoked",
			slog.String("user", ClientIDOwner(cl.ID)), slog.String("client_id", cl.ID))
	}
}

// ClientID returns a client id that user (a device id, or WorkerUserPrefix
// and a worker id) may use: its base one, or with name after a "/" when
// name is not empty, for a process that needs several.
func ClientID(user, name string) string {
	id := user
	if w, ok := strings.CutPrefix(user, WorkerUserPrefix); ok {
		id = WorkerClientIDPrefix + w
	}
	if name != "" {
		id += "/" + name
	}
	return id
}
