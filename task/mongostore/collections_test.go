package mongostore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/task"
)

// The filter is checked, and rewritten onto the change event's
// fullDocument, with deletes let through when watched.
func TestWatchPipeline(t *testing.T) {
	w := task.CollectionWatch{Database: "app", Collection: "orders", Operations: []string{"insert", "update", "delete"},
		Filter: json.RawMessage(`{"a": 1, "$or": [{"b.c": {"$gt": 2}}, {"d": {"$in": [1, 2]}}], "e": {"$elemMatch": {"f": 1}}}`)}
	p, err := watchPipeline(w)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bson.MarshalExtJSON(bson.D{{Key: "p", Value: p}}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"p":[{"$match":{"operationType":{"$in":["insert","update","delete"]}}},{"$match":{"$or":[` +
		`{"operationType":{"$in":["insert","update"]},"fullDocument.a":1,"$or":[{"fullDocument.b.c":{"$gt":2}},{"fullDocument.d":{"$in":[1,2]}}],` +
		`"fullDocument.e":{"$elemMatch":{"f":1}}},{"operationType":"delete"}]}}]}`
	if string(got) != want {
		t.Errorf("pipeline\n got %s\nwant %s", got, want)
	}
	for filter, field := range map[string]string{
		`{"a": {"$gt": 1, "b": 2}}`:         "filter.a: b is not a query operator",
		`{"a": {"b": 2, "$gt": 1}}`:         "filter.a: mixes",
		`{"$and": [1]}`:                     "filter.$and[0]",
		`{"a": {"$elemMatch": {"$zz": 1}}}`: "filter.a.$elemMatch",
		`{"a": {"$not": {"$nope": 1}}}`:     "filter.a.$not",
		`{"$text": {"$search": "x"}}`:       "filter: $text",
		`{"a": 1} {"b": 2}`:                 "filter: is not valid JSON",
	} {
		w.Filter = json.RawMessage(filter)
		if _, err := watchPipeline(w); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), field) {
			t.Errorf("filter %s: %v, want task.ErrInvalid naming %q", filter, err, field)
		}
	}
}
