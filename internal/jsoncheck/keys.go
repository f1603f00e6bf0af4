package jsoncheck

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/leasepool/leasepool/task"
)

// Keys refuses a JSON document in which one object holds a key twice.
// encoding/json keeps the last of them without a word, so a reader of the
// document (a reviewer, a proxy, a log) and the decoder could disagree
// about what it says. Keys are compared as decoded ("\u0061" is "a"); the
// keys of the top-level object are also compared without regard to case,
// since they are a request's field names, which encoding/json matches
// that way. The error wraps task.ErrInvalid and names the object (its
// path, "body" for the top level) and the key. It looks no deeper than
// Body lets a document nest: run it after that check. Like it, it does
// not check that b is JSON: the decoder that follows does.
func Keys(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var dup dupKeyError
	if errors.As(checkKeys(d, "", 0), &dup) {
		return invalid(dup.path, dup.Error())
	}
	return nil
}

type dupKeyError struct{ path, key string }

func (e dupKeyError) Error() string { return fmt.Sprintf("key %q is given twice", e.key) }

// errTooDeep ends a walk past the nesting Body allows.
var errTooDeep = errors.New("nested too deep")

// checkKeys reads one value from d, at depth containers deep; path is
// where it sits ("" for the whole document).
func checkKeys(d *json.Decoder, path string, depth int) error {
	if depth > task.MaxStoredDepth+bodySlack {
		return errTooDeep
	}
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			name := key
			if path == "" {
				name = foldKey(key)
			}
			if seen[name] {
				return dupKeyError{path: cmp.Or(path, "body"), key: key}
			}
			seen[name] = true
			child := pathSegment(key)
			if path != "" {
				child = path + "." + child
			}
			if err := checkKeys(d, child, depth+1); err != nil {
				return err
			}
		}
	case json.Delim('['):
		for i := 0; d.More(); i++ {
			if err := checkKeys(d, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
	default:
		return nil
	}
	_, err = d.Token() // the closing delimiter
	return err
}

// foldKey maps each rune of key to the least of the runes Unicode folds
// it with ("K", "k" and the Kelvin sign are one), so that two keys
// strings.EqualFold finds equal, as encoding/json matches field names,
// fold to one string.
func foldKey(key string) string {
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, key)
}

// pathSegment is key as a part of an error's field path: quoted when it
// holds a character a terminal would not show as itself.
func pathSegment(key string) string {
	if key == "" || strings.ContainsFunc(key, func(r rune) bool { return !strconv.IsPrint(r) || r == '.' || r == ' ' }) {
		return strconv.Quote(key)
	}
	return key
}
