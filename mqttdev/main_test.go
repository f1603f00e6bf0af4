package mqttdev

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.PahoShutdownGoroutines()...)
}
