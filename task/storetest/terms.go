// terms.go checks documents' terms: written with the put, replaced by
// the next, gone with the delete, untouched by a put that loses its
// compare-and-set, and bad terms refused with nothing written.

package storetest

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/leasepool/leasepool/task"
)

func (s suite) terms(t *testing.T) {
	t.Run("FoundByTerm", s.termsFound)
	t.Run("PutReplaces", s.termsReplaced)
	t.Run("DeleteDrops", s.termsDeleted)
	t.Run("ConflictWritesNone", s.termsConflict)
	t.Run("Invalid", s.termsInvalid)
	t.Run("ConcurrentPuts", s.termsConcurrent)
}

// byTerms returns the ids DocumentsByTerms finds, checking that each
// document comes with the terms asked for.
func byTerms(t *testing.T, st task.Store, ns string, terms ...string) []string {
	t.Helper()
	docs, err := st.DocumentsByTerms(ctxFor(t), ns, terms)
	if err != nil {
		t.Fatalf("DocumentsByTerms %s %q: %v", ns, terms, err)
	}
	ids := []string{}
	for _, d := range docs {
		if d.Namespace != ns || !task.HasTerms(d.Terms, slices.Sorted(slices.Values(terms))) {
			t.Fatalf("DocumentsByTerms %s %q returned %s/%s with terms %q", ns, terms, d.Namespace, d.ID, d.Terms)
		}
		ids = append(ids, d.ID)
	}
	return ids
}

func wantIDs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %q; want %q", what, got, want)
	}
}

func (s suite) termsFound(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	put := func(ns, id string, terms ...string) task.Document {
		return mustPutDocument(t, st, task.Document{Namespace: ns, ID: id, Value: json.RawMessage(`{}`), Terms: terms})
	}
	// Stored sorted and without duplicates.
	a := put("inv", "a", "region=eu", "model=x", "region=eu")
	if want := []string{"model=x", "region=eu"}; !slices.Equal(a.Terms, want) {
		t.Fatalf("PutDocument returned terms %q; want %q", a.Terms, want)
	}
	if got, err := st.GetDocument(ctx, "inv", "a"); err != nil || !slices.Equal(got.Terms, a.Terms) {
		t.Fatalf("GetDocument: terms %q, %v; want %q", got.Terms, err, a.Terms)
	}
	put("inv", "b", "region=eu", "model=y")
	put("inv", "c", "region=us", "model=x")
	put("inv", "d") // no terms
	put("other", "a", "region=eu")

	wantIDs(t, "region=eu", byTerms(t, st, "inv", "region=eu"), "a", "b")
	wantIDs(t, "model=x", byTerms(t, st, "inv", "model=x"), "a", "c")
	wantIDs(t, "region=eu and model=x", byTerms(t, st, "inv", "region=eu", "model=x"), "a")
	wantIDs(t, "model=x and region=eu", byTerms(t, st, "inv", "model=x", "region=eu", "model=x"), "a")
	wantIDs(t, "region=eu and model=z", byTerms(t, st, "inv", "region=eu", "model=z"))
	wantIDs(t, "unknown term", byTerms(t, st, "inv", "region=ap"))
	wantIDs(t, "region=eu in other", byTerms(t, st, "other", "region=eu"), "a")
	wantIDs(t, "a namespace with no documents", byTerms(t, st, "none", "region=eu"))

	docs, err := st.Documents(ctx, "inv")
	if err != nil || len(docs) != 4 || !slices.Equal(docs[0].Terms, a.Terms) || docs[3].Terms != nil {
		t.Fatalf("Documents: %+v, %v; want a..d, a with terms %q, d with none", docs, err, a.Terms)
	}
	if _, err := st.DocumentsByTerms(ctx, "inv", nil); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "terms") {
		t.Fatalf("DocumentsByTerms with no term: %v; want ErrInvalid naming terms", err)
	}
	if _, err := st.DocumentsByTerms(ctx, "inv", []string{""}); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "terms") {
		t.Fatalf("DocumentsByTerms with an empty term: %v; want ErrInvalid naming terms", err)
	}
}

func (s suite) termsReplaced(t *testing.T) {
	st := s.store(t)
	d := mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`1`), Terms: []string{"k=1", "keep"}})
	d = mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Version: d.Version, Value: json.RawMessage(`2`), Terms: []string{"k=2", "keep"}})
	wantIDs(t, "old term after a put that dropped it", byTerms(t, st, "inv", "k=1"))
	wantIDs(t, "new term", byTerms(t, st, "inv", "k=2"), "a")
	wantIDs(t, "kept term", byTerms(t, st, "inv", "keep"), "a")
	// A put without terms drops them all.
	mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Version: d.Version, Value: json.RawMessage(`3`)})
	wantIDs(t, "terms after a put without any", byTerms(t, st, "inv", "keep"))
	if got, err := st.GetDocument(ctxFor(t), "inv", "a"); err != nil || got.Terms != nil {
		t.Fatalf("GetDocument after a put without terms: terms %q, %v; want none", got.Terms, err)
	}
}

func (s suite) termsDeleted(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	d := mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`1`), Terms: []string{"k=1"}})
	mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "b", Value: json.RawMessage(`1`), Terms: []string{"k=1"}})
	if err := st.DeleteDocument(ctx, "inv", "a", d.Version+1); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("DeleteDocument at a wrong version: %v; want ErrConflict", err)
	}
	wantIDs(t, "after a delete that lost", byTerms(t, st, "inv", "k=1"), "a", "b")
	if err := st.DeleteDocument(ctx, "inv", "a", d.Version); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "after deleting a", byTerms(t, st, "inv", "k=1"), "b")
	if err := st.DeleteDocument(ctx, "inv", "b", 0); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "after deleting b", byTerms(t, st, "inv", "k=1"))
	// Created again without terms: none of the old come back.
	mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`1`)})
	wantIDs(t, "after a new a without terms", byTerms(t, st, "inv", "k=1"))
}

func (s suite) termsConflict(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	d := mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`1`), Terms: []string{"k=1"}})
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: "a", Version: d.Version + 1, Value: json.RawMessage(`2`), Terms: []string{"k=2"}}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("put at a wrong version: %v; want ErrConflict", err)
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`2`), Terms: []string{"k=2"}}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("create of a stored document: %v; want ErrConflict", err)
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: "b", Version: 4, Value: json.RawMessage(`2`), Terms: []string{"k=2"}}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("put at version 4 of a missing document: %v; want ErrConflict", err)
	}
	wantIDs(t, "old term after lost puts", byTerms(t, st, "inv", "k=1"), "a")
	wantIDs(t, "lost puts' term", byTerms(t, st, "inv", "k=2"))
	if got, err := st.GetDocument(ctx, "inv", "a"); err != nil || !slices.Equal(got.Terms, []string{"k=1"}) {
		t.Fatalf("GetDocument after lost puts: terms %q, %v; want [k=1]", got.Terms, err)
	}
}

func (s suite) termsInvalid(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	d := mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`1`), Terms: []string{"k=1"}})
	many := make([]string, task.MaxDocumentTerms+1)
	for i := range many {
		many[i] = "t" + strings.Repeat("x", i)
	}
	for name, terms := range map[string][]string{
		"empty":     {"k=2", ""},
		"too long":  {strings.Repeat("x", task.MaxTermLen+1)},
		"too many":  many,
		"control":   {"k=2\n"},
		"nul":       {"k\x00"},
		"not utf-8": {"k=\xff"},
	} {
		for _, version := range []int64{0, d.Version} {
			id := map[int64]string{0: "new", d.Version: "a"}[version]
			_, err := st.PutDocument(ctx, task.Document{Namespace: "inv", ID: id, Version: version, Value: json.RawMessage(`2`), Terms: terms})
			if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "document terms") {
				t.Fatalf("%s terms on %s: %v; want ErrInvalid naming document terms", name, id, err)
			}
		}
	}
	if _, err := st.GetDocument(ctx, "inv", "new"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("GetDocument of a document refused: %v; want ErrNotFound", err)
	}
	got, err := st.GetDocument(ctx, "inv", "a")
	if err != nil || got.Version != d.Version || !slices.Equal(got.Terms, []string{"k=1"}) {
		t.Fatalf("document after refused puts: %+v, %v; want version %d, terms [k=1]", got, err, d.Version)
	}
	wantIDs(t, "k=2 after refused puts", byTerms(t, st, "inv", "k=2"))
	wantIDs(t, "k=1 after refused puts", byTerms(t, st, "inv", "k=1"), "a")
	// The longest and most terms are fine.
	long := strings.Repeat("y", task.MaxTermLen)
	mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Version: d.Version, Value: json.RawMessage(`3`), Terms: append(many[:task.MaxDocumentTerms-1], long)})
	wantIDs(t, "the longest term", byTerms(t, st, "inv", long), "a")
	wantIDs(t, "two of the most terms", byTerms(t, st, "inv", many[0], many[task.MaxDocumentTerms-2]), "a")
}

// termsConcurrent puts one document with different terms from several
// writers at once: whichever puts win, the index holds exactly the
// terms of the document as stored.
func (s suite) termsConcurrent(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	mustPutDocument(t, st, task.Document{Namespace: "inv", ID: "a", Value: json.RawMessage(`0`), Terms: []string{"w=none"}})
	const writers = 4
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				for {
					d, err := st.GetDocument(ctx, "inv", "a")
					if err != nil {
						t.Error(err)
						return
					}
					d.Terms = []string{"w=" + string(rune('a'+w)), "any"}
					if _, err = st.PutDocument(ctx, d); task.RetryConflict(ctx, &err) {
						continue
					}
					if err != nil {
						t.Error(err)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	got, err := st.GetDocument(ctx, "inv", "a")
	if err != nil || got.Version != 1+writers*10 || len(got.Terms) != 2 {
		t.Fatalf("after the writers: %+v, %v; want version %d with 2 terms", got, err, 1+writers*10)
	}
	for _, term := range []string{"w=none", "w=a", "w=b", "w=c", "w=d"} {
		want := []string{}
		if slices.Contains(got.Terms, term) {
			want = []string{"a"}
		}
		wantIDs(t, term, byTerms(t, st, "inv", term), want...)
	}
}
