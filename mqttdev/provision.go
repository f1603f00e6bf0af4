// Provisioning a device: its MQTT credential and the vouching that comes
// with it, in one place for the CLI and the API.

package mqttdev

import (
	"context"
	"fmt"

	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/task"
)

// VouchedByCredential is the vouching Provision records: the operator who
// gave the device its credential answers for it.
const VouchedByCredential = "credential"

// Provision gives device id its MQTT credential (credential.Add; replace
// rotates one it has) and vouches for it, so that rollouts may select it;
// a device already vouched for keeps its first vouching. It returns the
// secret, to be shown once. The credential is written first: a failure
// after it leaves a device that can connect but is still new, never one
// selected without a credential.
func Provision(ctx context.Context, ds task.DocumentStore, id string, replace bool) (string, error) {
	secret, err := credential.Add(ctx, ds, id, replace)
	if err != nil {
		return "", err
	}
	if err := Vouch(ctx, ds, id, VouchedByCredential); err != nil {
		return "", fmt.Errorf("device %s: credential made, not vouched for (leasepool device approve %s): %w", id, id, err)
	}
	return secret, nil
}

// Deprovision revokes device id's credential (credential.Revoke) and the
// vouching that came with it: the device is new again. An operator's own
// vouching (device approve) stays.
func Deprovision(ctx context.Context, ds task.DocumentStore, id string) error {
	if err := credential.Revoke(ctx, ds, id); err != nil {
		return err
	}
	inv, err := GetInventory(ctx, ds, id)
	if err != nil || inv.Vouched == nil || inv.Vouched.By != VouchedByCredential {
		return err
	}
	return Unvouch(ctx, ds, id)
}
