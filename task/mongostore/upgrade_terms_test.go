package mongostore_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// TestDocumentsWithoutTerms: a document as a version without terms wrote
// it (no terms field, as before the upgrade, or by a process of such a
// version since) is returned by every DocumentsByTerms query, its terms
// unknown, until a put gives it some; the terms' index is there.
func TestDocumentsWithoutTerms(t *testing.T) {
	uri := testservers.MongoURI(t)
	st, _ := openFresh(t, uri)
	ctx := t.Context()
	coll := st.Database().Collection(mongostore.DocumentsCollection)
	for _, id := range []string{"old-a", "old-b"} {
		if _, err := coll.InsertOne(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "ns", Value: "inv"}, {Key: "id", Value: id}}}, {Key: "ns", Value: "inv"}, {Key: "id", Value: id},
			{Key: "version", Value: int64(3)}, {Key: "value", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "updated_at", Value: time.Now().UTC()},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: "new", Value: json.RawMessage(`1`), Terms: []string{"k=1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: "none", Value: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	ids := func(term string) []string {
		docs, err := st.DocumentsByTerms(ctx, "inv", []string{term})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range docs {
			out = append(out, d.ID)
		}
		return out
	}
	if got, want := ids("k=1"), []string{"new", "old-a", "old-b"}; !slices.Equal(got, want) {
		t.Fatalf("k=1: %q; want %q (the term's, and those stored without terms)", got, want)
	}
	if got, want := ids("k=2"), []string{"old-a", "old-b"}; !slices.Equal(got, want) {
		t.Fatalf("k=2: %q; want %q", got, want)
	}
	d, err := st.GetDocument(ctx, "inv", "old-a")
	if err != nil || d.Terms != nil || d.Version != 3 {
		t.Fatalf("old-a: %+v, %v; want version 3, no terms", d, err)
	}
	d.Terms = []string{"k=2"}
	if _, err := st.PutDocument(ctx, d); err != nil {
		t.Fatal(err)
	}
	if got, want := ids("k=1"), []string{"new", "old-b"}; !slices.Equal(got, want) {
		t.Fatalf("k=1 after old-a got terms: %q; want %q", got, want)
	}
	if got, want := ids("k=2"), []string{"old-a", "old-b"}; !slices.Equal(got, want) {
		t.Fatalf("k=2 after old-a got terms: %q; want %q", got, want)
	}

	specs, err := coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(specs, func(s mongo.IndexSpecification) bool { return s.Name == "ns_terms" }) {
		t.Fatalf("indexes of %s: %+v; want ns_terms", mongostore.DocumentsCollection, specs)
	}
}
