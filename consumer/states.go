// states.go: the scheduler's checks of its claim table
// (consumer/internal/claimtab), which the package's tests turn on.

package consumer

import (
	"fmt"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
)

// strictStates makes a refused move panic instead of being reported;
// the package's tests set it, so that every scheduler they run checks
// the table after each turn of its loop (checkStates).
var strictStates bool

// checkStates panics when the claim table disagrees with its indexes, or
// a task runs here that the table shows neither running nor claiming
// with its landed notice still to be taken (the attempt posts it before
// the run table shows the run).
func (s *scheduler) checkStates() {
	if err := s.tab.Check(); err != nil {
		panic("claim table: " + err.Error())
	}
	for _, key := range s.running.Keys() {
		st := s.tab.State(key)
		if st == claimtab.Running || st == claimtab.Claiming && s.landed.has(key, s.tab.Attempt(key)) {
			continue
		}
		panic(fmt.Sprintf("claim table: %s runs here but is %s", key, st))
	}
}
