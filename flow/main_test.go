package flow

import (
	"os"
	"strconv"
	"testing"
)

// TestMain runs the package's tests with every flow split into parts of
// LEASEPOOL_FLOW_SPLIT steps when that is set (the same rules, on the
// storage of flows past 100 steps):
//
//	LEASEPOOL_FLOW_SPLIT=2 go test -race -count=1 ./flow/
func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv("LEASEPOOL_FLOW_SPLIT")); err == nil && n > 0 {
		inlineSteps, partSteps, specPartBytes = 0, n, 300
	}
	os.Exit(m.Run())
}
