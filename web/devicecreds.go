package web

// The device credentials: made, replaced and revoked through the API,
// with the rights of any other write.

import (
	"errors"
	"net/http"
	"time"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/mqttdev"
)

// credentialAnswer is a new credential: the secret appears in this answer
// only (the store keeps its hash).
type credentialAnswer struct {
	ID       string    `json:"id"`
	Username string    `json:"username"`
	Secret   string    `json:"secret"`
	At       time.Time `json:"created_at"`
}

// postDeviceCredential gives device {id} a new credential: 201 with the
// secret; 409 when the device has one, unless the body is
// {"rotate":true}. The body may be empty.
func (a *api) postDeviceCredential(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Rotate bool `json:"rotate"`
	}
	if r.ContentLength != 0 {
		if err := decode(w, r, &b); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	id := r.PathValue("id")
	secret, err := mqttdev.Provision(r.Context(), a.store, id, b.Rotate)
	switch {
	case errors.Is(err, credential.ErrExists):
		writeError(w, http.StatusConflict, err.Error()+`: send {"rotate":true} to replace it`)
		return
	case err != nil:
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: device credential made", "device", id, "rotate", b.Rotate)
	writeJSON(w, http.StatusCreated, credentialAnswer{ID: id, Username: id, Secret: secret, At: time.Now().UTC()})
}

// deleteDeviceCredential revokes device {id}'s credential: 200, or 404
// when it has none.
func (a *api) deleteDeviceCredential(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	err := mqttdev.Deprovision(r.Context(), a.store, id)
	switch {
	case errors.Is(err, credential.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: device credential revoked", "device", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "revoked": true})
}
