// Reading and checking what an operator asks for: names, waves, rates,
// abort rules and the spec as a whole.

package rollout

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, fmt.Sprintf(format, args...))
}

// ValidateName checks a rollout name: 1 to MaxNameLen bytes of ASCII
// letters, digits, '.', '_' and '-', starting with a letter or digit, so
// it is one URL path segment and one part of a task key.
func ValidateName(name string) error {
	switch {
	case name == "":
		return invalid("name", "must not be empty")
	case len(name) > MaxNameLen:
		return invalid("name", "is longer than %d bytes", MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !ok && (i == 0 || (c != '.' && c != '_' && c != '-')) {
			return invalid("name", "%q: letters, digits, '.', '_' and '-' only, starting with a letter or digit", name)
		}
	}
	return nil
}

// ParseWaves reads cumulative wave targets: "1,5%,25%,100%". Targets must
// not go down, and the last must be 100%.
func ParseWaves(s string) ([]WaveTarget, error) {
	parts := strings.Split(s, ",")
	if len(parts) > MaxWaves {
		return nil, invalid("waves", "%d waves, more than %d", len(parts), MaxWaves)
	}
	var out []WaveTarget
	for _, p := range parts {
		p = strings.TrimSpace(p)
		var t WaveTarget
		if num, ok := strings.CutSuffix(p, "%"); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || !(v > 0 && v <= 100) || math.IsNaN(v) {
				return nil, invalid("waves", "%q: a percentage must be in (0,100]", p)
			}
			t.Percent = v
		} else {
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 || n > MaxDevices {
				return nil, invalid("waves", "%q: want a count from 1 to %d or a percentage such as 25%%", p, MaxDevices)
			}
			t.Count = n
		}
		out = append(out, t)
	}
	return out, checkWaves(out)
}

func checkWaves(ws []WaveTarget) error {
	if len(ws) == 0 {
		return nil
	}
	if len(ws) > MaxWaves {
		return invalid("waves", "%d waves, more than %d", len(ws), MaxWaves)
	}
	for i, t := range ws {
		if (t.Count > 0) == (t.Percent > 0) || t.Count < 0 || t.Count > MaxDevices || !(t.Percent >= 0 && t.Percent <= 100) {
			return invalid("waves", "wave %d: give a count from 1 to %d or a percentage in (0,100]", i+1, MaxDevices)
		}
		// A count after a percentage, or the reverse, is compared once
		// the devices are known (Create).
		if i > 0 && (t.Percent > 0 && t.Percent < ws[i-1].Percent || t.Count > 0 && t.Count < ws[i-1].Count) {
			return invalid("waves", "wave %d: %s is below the previous target %s (targets are cumulative and must not go down)", i+1, t, ws[i-1])
		}
	}
	if last := ws[len(ws)-1]; last.Percent != 100 {
		return invalid("waves", "the last wave must be 100%% (targets are cumulative), got %s", last)
	}
	return nil
}

// ParseAbortRules reads abort rules, separated by ';': each
// "KIND[|KIND...]>N% after M", KIND one of failed, refused, timed_out,
// offline, or any (all four).
func ParseAbortRules(s string) ([]AbortRule, error) {
	var out []AbortRule
	for _, part := range strings.Split(s, ";") {
		r, err := parseAbortRule(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseAbortRule(s string) (AbortRule, error) {
	bad := func(why string) (AbortRule, error) {
		return AbortRule{}, invalid("abort-when", "%q: %s (want e.g. failed>10%% after 20)", s, why)
	}
	kinds, rest, ok := strings.Cut(s, ">")
	if !ok {
		return bad("no '>'")
	}
	pct, after, ok := strings.Cut(strings.TrimSpace(rest), "%")
	if !ok {
		return bad("the threshold must be a percentage")
	}
	var r AbortRule
	v, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
	if err != nil || !(v >= 0 && v < 100) {
		return bad("the percentage must be in [0,100)")
	}
	r.Percent = v
	after = strings.TrimSpace(after)
	if after != "" {
		n, ok := strings.CutPrefix(after, "after ")
		m, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || err != nil || m < 1 || m > MaxDevices {
			return bad(fmt.Sprintf("'after' takes a count from 1 to %d", MaxDevices))
		}
		r.After = m
	}
	for _, k := range strings.Split(strings.TrimSpace(kinds), "|") {
		switch o := Outcome(strings.TrimSpace(k)); {
		case o == "any":
			r.Kinds = append(r.Kinds, FailureKinds...)
		case o.Failure():
			r.Kinds = append(r.Kinds, o)
		default:
			return bad(fmt.Sprintf("kind %q is not one of failed, refused, timed_out, offline, any", k))
		}
	}
	slices.Sort(r.Kinds)
	r.Kinds = slices.Compact(r.Kinds)
	return r, nil
}

// ParseRate reads "N/DURATION" (control.ParseRate's syntax).
func ParseRate(s string) (Rate, error) {
	n, per, err := control.ParseRate(s)
	if err != nil {
		return Rate{}, fmt.Errorf("rate: %w", err)
	}
	r := Rate{N: n, Per: task.Duration(per)}
	return r, r.validate()
}

func (r Rate) validate() error {
	if r.N == 0 && r.Per == 0 {
		return nil
	}
	if r.N < 1 || r.N > MaxRate {
		return invalid("rate", "N must be 1 to %d, got %d", MaxRate, r.N)
	}
	if p := time.Duration(r.Per); p < time.Millisecond || p > 24*time.Hour {
		return invalid("rate", "the duration must be from 1ms to 24h, got %s", p)
	}
	return nil
}

// ParseRetryOn reads failure kinds "timed_out,offline" ("any": all).
func ParseRetryOn(s string) ([]Outcome, error) {
	var out []Outcome
	for _, k := range strings.Split(s, ",") {
		switch o := Outcome(strings.TrimSpace(k)); {
		case o == "any":
			out = append(out, FailureKinds...)
		case o.Failure():
			out = append(out, o)
		default:
			return nil, invalid("retry-on", "%q is not one of failed, refused, timed_out, offline, any", k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Validate checks the spec; errors wrap task.ErrInvalid and name the field.
func (s Spec) Validate() error {
	if err := protocol.ValidateCommandName(s.Command); err != nil {
		return err
	}
	if err := protocol.CheckArgs(s.Args); err != nil {
		return err
	}
	if n := len(compactArgs(s.Args)); n > MaxArgsLen {
		return invalid("args", "%d bytes compacted, more than %d", n, MaxArgsLen)
	}
	switch {
	case (s.Select == "") == (len(s.Devices) == 0):
		return invalid("select", "give exactly one of select and devices")
	case s.Select != "":
		sel, err := mqttdev.ParseSelector(s.Select)
		if err != nil {
			return err
		}
		// Whoever can publish a device's status sets its attributes:
		// the devices a rollout commands are the operator's choice.
		if attrs := sel.Attributes(); len(attrs) > 0 {
			return invalid("select", "term %q reads an attribute the device announced; a rollout selects by operator labels only (leasepool device label)", attrs[0].String())
		}
	default:
		if len(s.Devices) > MaxDevices {
			return invalid("devices", "%d devices, more than %d", len(s.Devices), MaxDevices)
		}
		seen := map[string]bool{}
		for _, d := range s.Devices {
			if err := mqttdev.ValidateID("devices", d); err != nil {
				return err
			}
			if seen[d] {
				return invalid("devices", "%q is named twice", d)
			}
			seen[d] = true
		}
	}
	if err := checkWaves(s.Waves); err != nil {
		return err
	}
	if !(s.GateFailures >= 0 && s.GateFailures <= 100) {
		return invalid("gate_failures", "must be in [0,100], got %v", s.GateFailures)
	}
	if err := s.Rate.validate(); err != nil {
		return err
	}
	for _, r := range s.AbortWhen {
		if len(r.Kinds) == 0 || !(r.Percent >= 0 && r.Percent < 100) || r.After < 0 || r.After > MaxDevices {
			return invalid("abort_when", "%s: kinds, a percentage in [0,100) and after in 0..%d", r, MaxDevices)
		}
		for _, k := range r.Kinds {
			if !k.Failure() {
				return invalid("abort_when", "kind %q is not one of failed, refused, timed_out, offline", k)
			}
		}
	}
	if len(s.AbortWhen) > 8 {
		return invalid("abort_when", "%d rules, more than 8", len(s.AbortWhen))
	}
	if s.Timeout < 0 || time.Duration(s.Timeout) > 24*time.Hour {
		return invalid("timeout", "must be from 0 to 24h, got %s", time.Duration(s.Timeout))
	}
	if s.OfflineLimit < 0 || time.Duration(s.OfflineLimit) > 7*24*time.Hour {
		return invalid("offline_limit", "must be from 0 to 168h, got %s", time.Duration(s.OfflineLimit))
	}
	if s.Retries < 0 || s.Retries > MaxRetries {
		return invalid("retries", "must be 0 to %d, got %d", MaxRetries, s.Retries)
	}
	for _, k := range s.RetryOn {
		if !k.Failure() {
			return invalid("retry_on", "%q is not one of failed, refused, timed_out, offline", k)
		}
	}
	if s.RollbackCommand != "" {
		if err := protocol.ValidateCommandName(s.RollbackCommand); err != nil {
			return fmt.Errorf("rollback_command: %w", err)
		}
	}
	if len(s.RollbackArgs) > 0 {
		if s.RollbackCommand == "" {
			return invalid("rollback_args", "given without rollback_command")
		}
		if err := protocol.CheckArgs(s.RollbackArgs); err != nil {
			return fmt.Errorf("rollback_args: %w", err)
		}
		if n := len(compactArgs(s.RollbackArgs)); n > MaxArgsLen {
			return invalid("rollback_args", "%d bytes compacted, more than %d", n, MaxArgsLen)
		}
	}
	if s.Priority < -1000 || s.Priority > 1000 {
		return invalid("priority", "must be in -1000..1000, got %d", s.Priority)
	}
	return nil
}

// retries reports whether failure kind o gets another attempt.
func (s Spec) retries(o Outcome) bool {
	return len(s.RetryOn) == 0 || slices.Contains(s.RetryOn, o)
}

// command is the device command of one attempt of device.
func (s Spec) command(device string, rollback bool) mqttdev.Command {
	c := mqttdev.Command{Device: device, Command: s.Command, Args: s.Args, ResultTimeout: s.Timeout}
	if rollback {
		c.Command, c.Args = s.RollbackCommand, s.RollbackArgs
	}
	c.OfflineTimeout = s.OfflineLimit
	if c.OfflineTimeout == 0 {
		c.OfflineTimeout = task.Duration(DefaultOfflineLimit)
	}
	return c
}
