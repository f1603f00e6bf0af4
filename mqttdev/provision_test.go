package mqttdev

import (
	"context"
	"testing"

	"github.com/leasepool/leasepool/internal/credential"
)

// TestProvisionVouchesAndDeprovisionTakesItBack: a device given its
// credential is vouched for (rollouts may select it); revoking the
// credential makes it new again, unless an operator vouched for it
// himself.
func TestProvisionVouchesAndDeprovisionTakesItBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openInventoryStore(t)
	if _, err := SetLabels(ctx, st, "pump-1", LabelChange{Set: Labels{"ring": "prod"}}); err != nil {
		t.Fatal(err)
	}
	sel, _ := ParseSelector("ring=prod")
	picked := func() []string {
		t.Helper()
		ids, err := SelectDevices(ctx, st, sel)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if ids := picked(); len(ids) != 0 {
		t.Fatalf("selected %v before any vouching", ids)
	}
	secret, err := Provision(ctx, st, "pump-1", false)
	if err != nil || secret == "" {
		t.Fatalf("provision: %q %v", secret, err)
	}
	if c, err := credential.Get(ctx, st, "pump-1"); err != nil || !c.Matches(secret) {
		t.Fatalf("the stored credential does not match the secret: %v", err)
	}
	if ids := picked(); len(ids) != 1 || ids[0] != "pump-1" {
		t.Fatalf("selected %v after provisioning; want pump-1", ids)
	}
	if err := Deprovision(ctx, st, "pump-1"); err != nil {
		t.Fatal(err)
	}
	if ids := picked(); len(ids) != 0 {
		t.Fatalf("selected %v after the credential was revoked", ids)
	}
	// An operator's own vouching outlives the credential.
	if _, err := Provision(ctx, st, "pump-1", false); err != nil {
		t.Fatal(err)
	}
	if err := Unvouch(ctx, st, "pump-1"); err != nil {
		t.Fatal(err)
	}
	if err := Vouch(ctx, st, "pump-1", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := Deprovision(ctx, st, "pump-1"); err != nil {
		t.Fatal(err)
	}
	if ids := picked(); len(ids) != 1 {
		t.Fatalf("selected %v; the operator's vouching should stand after the revoke", ids)
	}
}
