// Package importrules holds the test that keeps leasepool's import graph
// as docs/DESIGN.md ("Layout") describes it: task imports nothing of
// leasepool's, features sit on the consumer and never the reverse, web and
// metrics reach a store only through task.Store, the device side never
// imports the worker side, nothing imports cmd, packages made for tests
// never reach production code, and the copied MQTT server (internal/mochi)
// stays apart; that the Layout lists exactly the packages go list
// reports; and that a module importing leasepool's broker builds that
// copy, not the published module. It has no code of its own.
package importrules
