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
// a task runs here that the table does not show being claimed.
func (s *scheduler) checkStates() {
	if err := s.tab.Check(); err != nil {
		panic("claim table: " + err.Error())
	}
	for _, key := range s.running.Keys() {
		if st := s.tab.State(key); st != claimtab.Claiming {
			panic(fmt.Sprintf("claim table: %s runs here but is %s", key, st))
		}
	}
}
