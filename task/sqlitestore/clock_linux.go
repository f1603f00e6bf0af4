package sqlitestore

import (
	"errors"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// defaultHost is Linux's CLOCK_BOOTTIME and boot id.
var defaultHost = hostClock{
	bootID: func() (string, error) {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err != nil {
			return "", err
		}
		id := strings.TrimSpace(string(b))
		if id == "" {
			return "", errors.New("empty boot id")
		}
		return id, nil
	},
	boottime: bootClock.read,
}

var bootClock = cachedBoot{clocks: wallAndMono, raw: rawBoottime}

func rawBoottime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
