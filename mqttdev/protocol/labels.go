// Device attributes and labels: the key=value pairs a device announces in
// its status message and an operator sets, and their checks.

package protocol

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// Bounds of labels (announced attributes and operator labels alike).
const (
	// MaxLabels is the most labels one device may carry, in each of its
	// announced and operator sets.
	MaxLabels = 32
	// MaxLabelKeyLen is the longest label key, in bytes.
	MaxLabelKeyLen = 63
	// MaxLabelValueLen is the longest label value, in bytes.
	MaxLabelValueLen = 128
)

// Labels are a device's attributes: model, firmware, site and any other
// key=value pair.
type Labels map[string]string

// ValidateLabelKey checks a label key: 1 to MaxLabelKeyLen bytes of ASCII
// letters, digits, '.', '_' and '-', starting with a letter or digit. The
// selector syntax (k=v,k!=v) and the CLI's "k-" removal need no quoting
// with these. Errors wrap task.ErrInvalid and name the key.
func ValidateLabelKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: label key: must not be empty", task.ErrInvalid)
	case len(key) > MaxLabelKeyLen:
		return fmt.Errorf("%w: label key %.20q...: is longer than %d bytes", task.ErrInvalid, key, MaxLabelKeyLen)
	case !alnum(key[0]):
		return fmt.Errorf("%w: label key %q: must start with a letter or digit", task.ErrInvalid, key)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !alnum(c) && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("%w: label key %q: only letters, digits, '.', '_' and '-' are allowed", task.ErrInvalid, key)
		}
	}
	return nil
}

// ValidateLabelValue checks the value of label key: 1 to MaxLabelValueLen
// bytes of ASCII letters, digits and ". _ - : / @ +". Errors wrap
// task.ErrInvalid and name the key.
func ValidateLabelValue(key, value string) error {
	switch {
	case value == "":
		return fmt.Errorf("%w: label %s: value must not be empty", task.ErrInvalid, key)
	case len(value) > MaxLabelValueLen:
		return fmt.Errorf("%w: label %s: value is longer than %d bytes", task.ErrInvalid, key, MaxLabelValueLen)
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; !alnum(c) && !strings.ContainsRune("._-:/@+", rune(c)) {
			return fmt.Errorf("%w: label %s: value %q: only letters, digits and . _ - : / @ + are allowed", task.ErrInvalid, key, value)
		}
	}
	return nil
}

// Validate checks every key and value and the count (field names the set
// in the error: "attributes", "labels").
func (l Labels) Validate(field string) error {
	if len(l) > MaxLabels {
		return fmt.Errorf("%w: %s: %d labels, more than %d", task.ErrInvalid, field, len(l), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(l)) {
		if err := ValidateLabelKey(k); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		if err := ValidateLabelValue(k, l[k]); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	return nil
}

// String is the labels as "k=v,k=v", by key.
func (l Labels) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(l)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + l[k])
	}
	return b.String()
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
