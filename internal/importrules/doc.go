// Package importrules holds the test that keeps leasepool's import graph
// as docs/DESIGN.md ("Layout") describes it: task imports nothing of
// leasepool's, features sit on the consumer and never the reverse, web and
// metrics reach a store only through task.Store, the device side never
// imports the worker side, nothing imports cmd, and packages made for
// tests never reach production code; and that the Layout lists exactly
// the packages go list reports. It has no code of its own.
package importrules
