package builtin_test

import (
	"strings"
	"testing"

	"github.com/leasepool/leasepool/builtin"
)

// The refusal of an unknown kind lists every kind Validate accepts.
func TestValidateNamesEveryKind(t *testing.T) {
	t.Parallel()
	err := builtin.Validate("bogus", nil)
	if err == nil {
		t.Fatal("Validate(bogus) = nil")
	}
	for _, k := range builtin.Kinds {
		if err := builtin.Validate(k, nil); err != nil && strings.Contains(err.Error(), "not a built-in kind") {
			t.Errorf("Validate(%s) = %v: a built-in kind refused as unknown", k, err)
		}
		if !strings.Contains(err.Error(), k) {
			t.Errorf("Validate(bogus) = %q: does not list %q", err, k)
		}
	}
}
