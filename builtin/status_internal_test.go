package builtin

import (
	"errors"
	"testing"

	"github.com/leasepool/leasepool/consumer"
)

func TestGuardStatus(t *testing.T) {
	t.Parallel()
	var snooze *consumer.SnoozeError
	if err := guardStatus("leaseout\n", nil); !errors.As(err, &snooze) || snooze.Delay != 0 {
		t.Errorf("leaseout = %v, want a Snooze(0): the attempt given back, no retry spent", err)
	}
	for status, want := range map[string]string{
		"exit 0\n":        "",
		"exit 3\n":        "exit status 3",
		"signal 9\n":      "signal: killed",
		"start no such\n": "no such",
		"garbage":         `guard: no status ("garbage")`,
	} {
		err := guardStatus(status, nil)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q = %v, want nil", status, err)
		case want != "" && (err == nil || err.Error() != want):
			t.Errorf("%q = %v, want %q", status, err, want)
		}
		if errors.As(err, &snooze) {
			t.Errorf("%q = %v: only leaseout gives the attempt back", status, err)
		}
	}
}
