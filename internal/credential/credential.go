// Package credential keeps the MQTT credentials of leasepool's device
// plane in the task store: one secret per device, stored as its SHA-256
// hash only, and the cluster's worker secret, which every worker sharing
// the store reads to log in to the embedded broker.
//
// A secret is 32 random bytes (base64url, 43 characters). For secrets of
// that entropy a single SHA-256 is as good as a slow password hash: there
// is no dictionary to try, and 2^256 guesses are out of reach. Hashes are
// compared in constant time.
package credential

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// Namespace is the task.Document namespace of the device credentials: one
// document per device id, holding the hash of its secret.
const Namespace = "leasepool.device-credential"

// WorkerNamespace holds the cluster's worker secret, in plain, in the
// document WorkerDocument. Whoever can read the store is trusted with
// everything already (it holds the tasks and can write them), so the
// secret is no weaker there than the store itself.
const (
	WorkerNamespace = "leasepool.mqtt-worker"
	WorkerDocument  = "cluster"
)

// WorkerUserPrefix starts the MQTT user name of a worker on the embedded
// broker: "worker:" and the worker id. No device may have an id starting
// with it.
const WorkerUserPrefix = broker.WorkerUserPrefix

// SecretBytes is the length of a secret before encoding.
const SecretBytes = 32

// ErrExists is returned by Add for a device that has a credential already.
var ErrExists = errors.New("device credential exists")

// ErrNotFound is returned for a device without a credential; it wraps
// task.ErrNotFound.
var ErrNotFound = fmt.Errorf("no device credential: %w", task.ErrNotFound)

// Credential is one device's stored credential: the hash, never the
// secret.
type Credential struct {
	ID string `json:"id"`
	// SHA256 is the hex SHA-256 of the secret.
	SHA256    string    `json:"sha256"`
	CreatedAt time.Time `json:"created_at"`
	// Simulated marks a credential made for a simulated device
	// (AddSimulated): a simulator replaces only those.
	Simulated bool `json:"simulated,omitempty"`
	// Version is the document's version (compare-and-set).
	Version int64 `json:"-"`
}

// Hash returns the SHA-256 of secret.
func Hash(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// Matches reports, in constant time, whether secret is this credential's.
func (c Credential) Matches(secret string) bool {
	want, err := hex.DecodeString(c.SHA256)
	if err != nil || len(want) != sha256.Size {
		return false
	}
	got := Hash(secret)
	return subtle.ConstantTimeCompare(got[:], want) == 1
}

// NewSecret returns SecretBytes random bytes, base64url without padding.
func NewSecret() (string, error) {
	b := make([]byte, SecretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("credential: random secret: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ValidateDeviceID checks id as a device id that may hold a credential: a
// valid device id that does not start with WorkerUserPrefix, nor with a
// client id prefix that names another identity on the broker
// (broker.ClientIDOwner), which would leave the device no client id of
// its own name. Errors wrap task.ErrInvalid.
func ValidateDeviceID(id string) error {
	if err := protocol.ValidateID("device", id); err != nil {
		return err
	}
	if strings.HasPrefix(id, WorkerUserPrefix) {
		return fmt.Errorf("%w: device: %q starts with %q, which names workers on the broker", task.ErrInvalid, id, WorkerUserPrefix)
	}
	for _, p := range []string{broker.WorkerClientIDPrefix, broker.SimClientIDPrefix} {
		if strings.HasPrefix(id, p) {
			return fmt.Errorf("%w: device: %q starts with %q, a client id prefix the broker reserves", task.ErrInvalid, id, p)
		}
	}
	return nil
}

// Get returns device id's credential, or ErrNotFound.
func Get(ctx context.Context, ds task.DocumentStore, id string) (Credential, error) {
	d, err := ds.GetDocument(ctx, Namespace, id)
	if errors.Is(err, task.ErrNotFound) {
		return Credential{}, fmt.Errorf("device %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Credential{}, fmt.Errorf("device credential %s: %w", id, err)
	}
	return decode(d)
}

func decode(d task.Document) (Credential, error) {
	var c Credential
	if err := json.Unmarshal(d.Value, &c); err != nil {
		return Credential{}, fmt.Errorf("device credential %s: %w", d.ID, err)
	}
	if c.ID != d.ID {
		return Credential{}, fmt.Errorf("device credential %s: holds device %q", d.ID, c.ID)
	}
	c.Version = d.Version
	return c, nil
}

// List returns every device credential. A document that does not decode
// is skipped and reported to task.SkipMalformed: its device cannot log in,
// and the others still can.
func List(ctx context.Context, ds task.DocumentStore) ([]Credential, error) {
	docs, err := ds.Documents(ctx, Namespace)
	if err != nil {
		return nil, fmt.Errorf("device credentials: %w", err)
	}
	out := make([]Credential, 0, len(docs))
	for _, d := range docs {
		c, err := decode(d)
		if err != nil {
			task.SkipMalformed(Namespace, d.ID+"@"+strconv.FormatInt(d.Version, 10), err)
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// Add gives device id a new credential and returns its secret, which is
// not kept: show it once. With replace false a device that has one
// already gets ErrExists; with replace true its old secret stops working
// (brokers see the change within their refresh interval).
func Add(ctx context.Context, ds task.DocumentStore, id string, replace bool) (string, error) {
	return put(ctx, ds, id, false, func(old *Credential) error {
		if old != nil && !replace {
			return fmt.Errorf("device %s: %w", id, ErrExists)
		}
		return nil
	})
}

// ErrNotSimulated is returned by AddSimulated for a device whose
// credential was not made for a simulated device.
var ErrNotSimulated = errors.New("device credential not made for a simulated device")

// AddSimulated is Add with replace for a simulated device: the credential
// is marked simulated, and only one so marked (or none) is replaced, so
// that a simulator given ids of real devices cannot cut them off.
func AddSimulated(ctx context.Context, ds task.DocumentStore, id string) (string, error) {
	return put(ctx, ds, id, true, func(old *Credential) error {
		if old != nil && !old.Simulated {
			return fmt.Errorf("device %s: %w", id, ErrNotSimulated)
		}
		return nil
	})
}

// AddSimulatedMany is AddSimulated for a fleet: it reads the stored
// credentials once (one round trip, not one per device), refuses the lot
// if any id holds a credential not made for a simulated device, then
// writes the new ones side by side, so that a store that commits writes
// in groups (SQLite's writer, Mongo's pipelined connections) makes ten
// thousand in about a second. It returns the secrets by id. A write that
// meets a concurrent one falls back to AddSimulated for that id.
func AddSimulatedMany(ctx context.Context, ds task.DocumentStore, ids []string) (map[string]string, error) {
	for _, id := range ids {
		if err := ValidateDeviceID(id); err != nil {
			return nil, err
		}
	}
	stored, err := List(ctx, ds)
	if err != nil {
		return nil, err
	}
	wanted := make(map[string]bool, len(ids))
	unique := make([]string, 0, len(ids))
	for _, id := range ids {
		if !wanted[id] {
			wanted[id] = true
			unique = append(unique, id)
		}
	}
	versions := make(map[string]int64, len(stored))
	for _, c := range stored {
		versions[c.ID] = c.Version
		if !c.Simulated && wanted[c.ID] {
			return nil, fmt.Errorf("device %s: %w", c.ID, ErrNotSimulated)
		}
	}
	out := make(map[string]string, len(ids))
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, bulkParallel)
	for _, id := range unique {
		if gctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			secret, err := putSimulated(gctx, ds, id, versions[id])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = err
					cancel()
				}
				return
			}
			out[id] = secret
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// putSimulated writes a new simulated credential for id over the stored
// version (0: none), falling back to AddSimulated on a conflict.
func putSimulated(ctx context.Context, ds task.DocumentStore, id string, version int64) (string, error) {
	secret, err := NewSecret()
	if err != nil {
		return "", err
	}
	h := Hash(secret)
	value, err := json.Marshal(Credential{ID: id, SHA256: hex.EncodeToString(h[:]), CreatedAt: time.Now().UTC(), Simulated: true})
	if err != nil {
		return "", err
	}
	_, err = ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: id, Version: version, Value: value})
	if errors.Is(err, task.ErrConflict) {
		secret, err = AddSimulated(ctx, ds, id)
	}
	if err != nil {
		return "", fmt.Errorf("device credential %s: %w", id, err)
	}
	return secret, nil
}

// bulkParallel bounds the writes AddSimulatedMany has under way at once:
// enough to fill a store's group commit, few enough not to crowd out the
// store's other callers.
const bulkParallel = 64

// put stores a new credential for id once check accepts the stored one
// (nil: none), by compare-and-set, reading again on a conflict.
func put(ctx context.Context, ds task.DocumentStore, id string, simulated bool, check func(old *Credential) error) (string, error) {
	if err := ValidateDeviceID(id); err != nil {
		return "", err
	}
	secret, err := NewSecret()
	if err != nil {
		return "", err
	}
	h := Hash(secret)
	value, err := json.Marshal(Credential{ID: id, SHA256: hex.EncodeToString(h[:]), CreatedAt: time.Now().UTC(), Simulated: simulated})
	if err != nil {
		return "", err
	}
	for {
		var old *Credential
		c, err := Get(ctx, ds, id)
		switch {
		case err == nil:
			old = &c
		case !errors.Is(err, task.ErrNotFound):
			return "", err
		}
		if err := check(old); err != nil {
			return "", err
		}
		var version int64
		if old != nil {
			version = old.Version
		}
		_, err = ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: id, Version: version, Value: value})
		if err == nil {
			return secret, nil
		}
		if !errors.Is(err, task.ErrConflict) {
			return "", fmt.Errorf("device credential %s: %w", id, err)
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
}

// Rotate replaces device id's credential, which must exist (ErrNotFound
// otherwise), and returns the new secret.
func Rotate(ctx context.Context, ds task.DocumentStore, id string) (string, error) {
	if err := ValidateDeviceID(id); err != nil {
		return "", err
	}
	if _, err := Get(ctx, ds, id); err != nil {
		return "", err
	}
	return Add(ctx, ds, id, true)
}

// Revoke deletes device id's credential: the device can no longer log in,
// and a broker checking the store disconnects it within its refresh
// interval. ErrNotFound if it had none.
func Revoke(ctx context.Context, ds task.DocumentStore, id string) error {
	if err := protocol.ValidateID("device", id); err != nil {
		return err
	}
	err := ds.DeleteDocument(task.WithInternalWrite(ctx), Namespace, id, 0)
	if errors.Is(err, task.ErrNotFound) {
		return fmt.Errorf("device %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("device credential %s: %w", id, err)
	}
	return nil
}

// WorkerUser is the MQTT user name of worker workerID on the embedded
// broker.
func WorkerUser(workerID string) string { return WorkerUserPrefix + workerID }

type workerDoc struct {
	Secret    string    `json:"secret"`
	CreatedAt time.Time `json:"created_at"`
}

// WorkerSecret returns the cluster's worker secret, making it on first
// use: every process sharing the store gets the same one.
func WorkerSecret(ctx context.Context, ds task.DocumentStore) (string, error) {
	for {
		s, err := readWorkerSecret(ctx, ds)
		if err == nil || !errors.Is(err, task.ErrNotFound) {
			return s, err
		}
		secret, err := NewSecret()
		if err != nil {
			return "", err
		}
		value, err := json.Marshal(workerDoc{Secret: secret, CreatedAt: time.Now().UTC()})
		if err != nil {
			return "", err
		}
		_, err = ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: WorkerNamespace, ID: WorkerDocument, Value: value})
		if err == nil {
			return secret, nil
		}
		if !errors.Is(err, task.ErrConflict) {
			return "", fmt.Errorf("worker secret: %w", err)
		}
		// Another process made it first: read theirs.
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
}

// readWorkerSecret returns the stored worker secret; task.ErrNotFound
// when none was made yet.
func readWorkerSecret(ctx context.Context, ds task.DocumentStore) (string, error) {
	d, err := ds.GetDocument(ctx, WorkerNamespace, WorkerDocument)
	if errors.Is(err, task.ErrNotFound) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("worker secret: %w", err)
	}
	var w workerDoc
	if err := json.Unmarshal(d.Value, &w); err != nil || w.Secret == "" {
		return "", fmt.Errorf("worker secret: malformed document %s/%s", WorkerNamespace, WorkerDocument)
	}
	return w.Secret, nil
}

// WorkerHash returns the hash of the cluster's worker secret, or false
// when none was made yet (no worker can log in then).
func WorkerHash(ctx context.Context, ds task.DocumentStore) ([32]byte, bool, error) {
	s, err := readWorkerSecret(ctx, ds)
	if errors.Is(err, task.ErrNotFound) {
		return [32]byte{}, false, nil
	}
	if err != nil {
		return [32]byte{}, false, err
	}
	return Hash(s), true, nil
}

// Source reads the credentials of ds for a broker (broker.Credentials):
// the hashes only.
func Source(ds task.DocumentStore) StoreSource { return StoreSource{ds} }

// StoreSource is Source's result.
type StoreSource struct{ ds task.DocumentStore }

// DeviceHash returns the hash of device id's secret; found is false when
// it has no credential.
func (s StoreSource) DeviceHash(ctx context.Context, id string) (hash [32]byte, found bool, err error) {
	c, err := Get(ctx, s.ds, id)
	if errors.Is(err, task.ErrNotFound) {
		return hash, false, nil
	}
	if err != nil {
		return hash, false, err
	}
	return c.hash()
}

// DeviceHashes returns the hash of every device's secret, by device id.
func (s StoreSource) DeviceHashes(ctx context.Context) (map[string][32]byte, error) {
	list, err := List(ctx, s.ds)
	if err != nil {
		return nil, err
	}
	out := make(map[string][32]byte, len(list))
	for _, c := range list {
		if h, ok, _ := c.hash(); ok {
			out[c.ID] = h
		}
	}
	return out, nil
}

// WorkerHash returns the hash of the cluster's worker secret; found is
// false when none was made yet.
func (s StoreSource) WorkerHash(ctx context.Context) (hash [32]byte, found bool, err error) {
	return WorkerHash(ctx, s.ds)
}

func (c Credential) hash() ([32]byte, bool, error) {
	var h [32]byte
	b, err := hex.DecodeString(c.SHA256)
	if err != nil || len(b) != len(h) {
		return h, false, fmt.Errorf("device credential %s: sha256 is not 64 hex digits", c.ID)
	}
	copy(h[:], b)
	return h, true, nil
}
