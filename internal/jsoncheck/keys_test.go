package jsoncheck_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/jsoncheck"
	"github.com/leasepool/leasepool/task"
)

func TestKeys(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{
		`{}`, `[]`, `1`, `"s"`, `null`,
		`{"labels":{"site":"a","Site":"b","ring":"c"}}`,
		`{"a":{"x":1},"b":{"x":1}}`,
		`[{"a":1},{"a":1}]`,
		`{"a":[{"k":1},{"k":2}]}`,
		`{"a":1,"b":`,               // not JSON: the decoder after it says so
		strings.Repeat(`[`, 100000), // jsoncheck.Body's to refuse
	} {
		if err := jsoncheck.Keys([]byte(ok)); err != nil {
			t.Errorf("Keys(%s) = %v, want nil", ok, err)
		}
	}
	for body, want := range map[string]string{
		`{"labels":{"site":"a","site":"b"}}`:                  `invalid: labels: key "site" is given twice`,
		`{"set":{"a":"1","\u0061":"2"},"remove":[]}`:          `invalid: set: key "a" is given twice`,
		`{"labels":{},"labels":{"ring":"canary"}}`:            `invalid: body: key "labels" is given twice`,
		`{"labels":{},"Labels":{"ring":"canary"}}`:            `invalid: body: key "Labels" is given twice`,
		`{"a":[{"k":1},{"k":{"z":1,"z":2}}]}`:                 `invalid: a[1].k: key "z" is given twice`,
		`{"a.b":{"x\u202e":{"k":1,"k":2}}}`:                   `invalid: "a.b"."x\u202e": key "k" is given twice`,
		"{\"labels\":{\"x\\u202e\":\"1\",\"x\u202e\":\"2\"}}": `invalid: labels: key "x\u202e" is given twice`,
		`[{"k":1,"k":2}]`:                                     `invalid: [0]: key "k" is given twice`,
	} {
		err := jsoncheck.Keys([]byte(body))
		if !errors.Is(err, task.ErrInvalid) || err.Error() != want {
			t.Errorf("Keys(%s) = %v, want %s", body, err, want)
		}
		if err != nil && strings.ContainsRune(err.Error(), '\u202e') {
			t.Errorf("Keys(%s): the error prints U+202E raw", body)
		}
	}
}
