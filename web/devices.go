package web

// Operators' writes to the device inventory beside its labels, over the
// API and from the dashboard: vouching for a device, forgetting one.

import (
	"errors"
	"net/http"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// approveDevice vouches for the device: {"by":"..."} names who, by
// default "operator"; the body may be empty. It answers the inventory
// entry.
func (a *api) approveDevice(w http.ResponseWriter, r *http.Request) {
	b := struct {
		By string `json:"by"`
	}{By: "operator"}
	if r.ContentLength != 0 {
		if err := decode(w, r, &b); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	inv, err := mqttdev.VouchAt(r.Context(), a.store, r.PathValue("id"), b.By, a.store.Now())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: device vouched for", "device", inv.ID, "by", inv.Vouched.By)
	writeJSON(w, http.StatusOK, inv)
}

// approveDevice is the Devices page's Approve button.
func (d *dashboard) approveDevice(r *http.Request) (string, string, error) {
	inv, err := mqttdev.VouchAt(r.Context(), d.store, r.PostForm.Get("device"), "operator (dashboard)", d.store.Now())
	if err != nil {
		return "", "", err
	}
	d.log.Info("web: dashboard vouched for a device", "device", inv.ID, "by", inv.Vouched.By)
	return "/devices", "device-approved", nil
}

// forgetDevice removes the device's inventory entry and stored state
// (mqttdev.Forget): {"forgotten":"ID"}, or 404 when neither was stored.
func (a *api) forgetDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	err := mqttdev.Forget(r.Context(), a.store, id)
	if errors.Is(err, task.ErrNotFound) {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: device forgotten", "device", id)
	writeJSON(w, http.StatusOK, map[string]string{"forgotten": id})
}
