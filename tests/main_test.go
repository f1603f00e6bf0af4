package tests

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// parallelTests is how many of the tests that call t.Parallel run at once
// unless -test.parallel says otherwise. Those tests spend their time
// waiting on worker processes, leases and timers, and what they assert
// survives a busy CPU (the package comment), so more of them than the
// machine has cores (GOMAXPROCS, go test's default) overlap their waits.
const parallelTests = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(parallelTests))
	}
	os.Exit(m.Run())
}
