package trigger_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/trigger"
)

func TestKeys(t *testing.T) {
	a, b := trigger.ChangeKey("t", task.Token("one")), trigger.ChangeKey("t", task.Token("two"))
	if a == b || a != trigger.ChangeKey("t", task.Token("one")) || !strings.HasPrefix(a, "trigger:t:") {
		t.Errorf("change keys %q %q: want distinct per token, the same for the same token", a, b)
	}
	s1 := trigger.ScanKey("t", json.RawMessage(`1`), json.RawMessage(`2`))
	s2 := trigger.ScanKey("t", json.RawMessage(`12`), json.RawMessage(``))
	if s1 == s2 || !strings.HasPrefix(s1, "trigger:t:scan:") {
		t.Errorf("scan keys %q %q: want the id and version kept apart", s1, s2)
	}
	if err := task.ValidateKey("key", s1); err != nil {
		t.Errorf("scan key: %v", err)
	}
}

func TestPayload(t *testing.T) {
	doc := json.RawMessage(`{"_id":{"$oid":"65a1"},"a":1,"b":{"c":2,"d":3},"e":"x"}`)
	for _, c := range []struct {
		fields []string
		id     json.RawMessage
		doc    json.RawMessage
		want   string
	}{
		{nil, json.RawMessage(`{"$oid":"65a1"}`), doc, string(doc)},
		{[]string{"a", "b.c", "missing"}, nil, doc, `{"_id":{"$oid":"65a1"},"a":1,"b":{"c":2}}`},
		{nil, json.RawMessage(`7`), nil, `{"_id":7}`},
		{nil, nil, nil, `{}`},
	} {
		tr := trigger.Trigger{Fields: c.fields}
		if got := string(tr.Payload(c.id, c.doc)); got != c.want {
			t.Errorf("Payload(fields %q) = %s, want %s", c.fields, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := trigger.Trigger{Name: "t", Collection: "app.orders", Kind: "k", Operations: trigger.DefaultOperations}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit  func(*trigger.Trigger)
		field string
	}{
		{func(tr *trigger.Trigger) { tr.Collection = "app." }, "collection:"},
		{func(tr *trigger.Trigger) { tr.Collection = "a b.orders" }, "collection:"},
		{func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`nope`) }, "filter:"},
		{func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`"x"`) }, "filter:"},
		{func(tr *trigger.Trigger) { tr.Operations = nil }, "operations:"},
		{func(tr *trigger.Trigger) { tr.Operations = []string{"insert", "insert"} }, "operations:"},
		{func(tr *trigger.Trigger) { tr.Fields = []string{"a..b"} }, "fields:"},
		{func(tr *trigger.Trigger) { tr.VersionField = "$v" }, "version_field:"},
		{func(tr *trigger.Trigger) { tr.Name = "leasepool.x" }, "name:"},
		{func(tr *trigger.Trigger) { tr.Name = strings.Repeat("n", 500) }, "name:"},
		{func(tr *trigger.Trigger) { tr.Options.LockKeys = []string{""} }, "lock"},
		{func(tr *trigger.Trigger) { tr.Kind = "" }, "kind"},
	} {
		tr := good
		c.edit(&tr)
		err := tr.Validate()
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Validate: %v, want task.ErrInvalid naming %q", err, c.field)
		}
	}
}

// A store with no collections to watch refuses a trigger.
func TestAddNeedsCollections(t *testing.T) {
	// The embedded store and memstore have no collections; neither has this.
	_, err := trigger.Add(t.Context(), noCollections{}, trigger.Trigger{Name: "t", Collection: "a.b", Kind: "k"}, false)
	if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "collection:") {
		t.Fatalf("Add: %v", err)
	}
}

type noCollections struct{ task.Store }

func TestTriggerJSON(t *testing.T) {
	tr := trigger.Trigger{Name: "t", Collection: "a.b", Kind: "k", Options: task.Options{Priority: 2, LockKeys: []string{"l"}}}
	b, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"options":{"priority":2,"lock_keys":["l"]}`) {
		t.Errorf("JSON %s", b)
	}
	var back trigger.Trigger
	if err := json.Unmarshal(b, &back); err != nil || back.Options.Priority != 2 || back.Options.LockKeys[0] != "l" {
		t.Errorf("back: %+v %v", back, err)
	}
}
