package mqttdev

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// scans counts the reads of a whole namespace of documents.
type scans struct {
	task.Store
	n atomic.Int64
}

func (s *scans) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if namespace == InventoryNamespace {
		s.n.Add(1)
	}
	return s.Store.Documents(ctx, namespace)
}

// scanSelect is Select as it was before the index: every entry decoded
// and matched.
func scanSelect(t testing.TB, ds task.DocumentStore, sel Selector) Selection {
	t.Helper()
	invs, err := Inventories(t.Context(), ds)
	if err != nil {
		t.Fatal(err)
	}
	var out Selection
	for id, inv := range invs {
		switch {
		case !sel.Matches(inv.Labels, inv.Attributes):
		case inv.New():
			out.New = append(out.New, id)
		default:
			out.Devices = append(out.Devices, id)
		}
	}
	slices.Sort(out.Devices)
	slices.Sort(out.New)
	return out
}

// TestSelectReadsTheIndex: on memstore, SQLite and MongoDB, Select picks the
// same devices as matching every entry would, for selectors of one and
// several key=value terms, with != terms, on labels and attributes;
// it reads the whole inventory only for a selector of != terms alone;
// and it follows every kind of inventory write: labels set, replaced and
// removed, attributes announced, vouching and unvouching, forgetting.
func TestSelectReadsTheIndex(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) task.Store{
		"memstore": func(t *testing.T) task.Store { return memstore.New(memstore.Config{}).Open() },
		"sqlite":   openInventoryStore,
		"mongo": func(t *testing.T) task.Store {
			st, err := mongostore.Open(t.Context(), testservers.MongoURI(t), &mongostore.Config{Database: fmt.Sprintf("select_index_%d", time.Now().UnixNano()%1e12)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = st.Database().Drop(context.Background())
				st.Close()
			})
			return st
		},
	} {
		t.Run(name, func(t *testing.T) {
			st := &scans{Store: open(t)}
			ctx := t.Context()
			rng := rand.New(rand.NewPCG(7, 7))
			regions, models := []string{"eu", "us", "ap"}, []string{"x", "y"}
			const devices = 60
			for i := range devices {
				id := fmt.Sprintf("dev-%02d", i)
				attrs := Labels{"model": models[rng.IntN(len(models))]}
				if rng.IntN(3) > 0 {
					attrs["fw"] = fmt.Sprintf("1.%d", rng.IntN(3))
				}
				if err := PutAttributes(ctx, st, id, attrs, time.Now()); err != nil {
					t.Fatal(err)
				}
				if rng.IntN(4) > 0 {
					if _, err := SetLabels(ctx, st, id, LabelChange{Set: Labels{"region": regions[rng.IntN(len(regions))]}}); err != nil {
						t.Fatal(err)
					}
				}
				if rng.IntN(5) > 0 {
					if _, err := VouchAt(ctx, st, id, "ops", time.Now()); err != nil {
						t.Fatal(err)
					}
				}
			}
			selectors := []string{
				"region=eu", "attr:model=x", "region=eu,attr:model=x", "region=us,attr:fw=1.1,attr:model=y",
				"region=eu,region=us", "region=ap,attr:fw!=1.0", "attr:model!=x,region=us", "region=none",
				"label:region=eu,attr:region=eu",
			}
			check := func(when string) {
				t.Helper()
				for _, s := range selectors {
					sel, err := ParseSelector(s)
					if err != nil {
						t.Fatal(err)
					}
					before := st.n.Load()
					got, err := Select(ctx, st, sel)
					if err != nil {
						t.Fatal(err)
					}
					if st.n.Load() != before {
						t.Fatalf("%s: Select %s read the whole inventory; want the index", when, s)
					}
					if want := scanSelect(t, st, sel); !slices.Equal(got.Devices, want.Devices) || !slices.Equal(got.New, want.New) {
						t.Fatalf("%s: Select %s = %+v; matching every entry gives %+v", when, s, got, want)
					}
				}
				// != terms alone: the whole inventory, and the same answer.
				sel, _ := ParseSelector("region!=eu")
				before := st.n.Load()
				got, err := Select(ctx, st, sel)
				if err != nil || st.n.Load() != before+1 {
					t.Fatalf("%s: Select region!=eu: %v, %d reads of the inventory; want 1", when, err, st.n.Load()-before)
				}
				if want := scanSelect(t, st, sel); !slices.Equal(got.Devices, want.Devices) || !slices.Equal(got.New, want.New) {
					t.Fatalf("%s: Select region!=eu = %+v; want %+v", when, got, want)
				}
			}
			check("first")
			eu, _ := ParseSelector("region=eu")
			if got, _ := Select(ctx, st, eu); len(got.Devices)+len(got.New) == 0 {
				t.Fatal("region=eu selects nothing: the test's inventory lacks it")
			}

			// Every write path moves devices in and out of the index.
			for i := 0; i < devices; i += 3 {
				id := fmt.Sprintf("dev-%02d", i)
				switch i % 4 {
				case 0:
					if _, err := SetLabels(ctx, st, id, LabelChange{Set: Labels{"region": "eu", "rack": "r1"}}); err != nil {
						t.Fatal(err)
					}
				case 1:
					if _, err := ReplaceLabels(ctx, st, id, Labels{}); err != nil {
						t.Fatal(err)
					}
				case 2:
					if err := PutAttributes(ctx, st, id, Labels{"model": "x", "fw": "1.1"}, time.Now()); err != nil {
						t.Fatal(err)
					}
					if err := Unvouch(ctx, st, id); err != nil {
						t.Fatal(err)
					}
				case 3:
					if err := Forget(ctx, st, id); err != nil {
						t.Fatal(err)
					}
				}
			}
			selectors = append(selectors, "rack=r1", "rack=r1,region=eu")
			check("after the writes")
		})
	}
}

// TestIndexInventoryGivesOldEntriesTerms: entries as an older leasepool
// stored them, without terms (a SQLite file of schema 12 upgraded, made
// here by clearing what the upgrade would not have), are selected all the
// same, and IndexInventory gives them their terms once.
func TestIndexInventoryGivesOldEntriesTerms(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	st, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	for i := range 10 {
		id := fmt.Sprintf("dev-%d", i)
		if _, err := SetLabels(ctx, st, id, LabelChange{Set: Labels{"region": []string{"eu", "us"}[i%2]}}); err != nil {
			t.Fatal(err)
		}
		if _, err := VouchAt(ctx, st, id, "ops", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	forgetTerms(t, path)
	sel, _ := ParseSelector("region=eu")
	got, err := Select(ctx, st, sel)
	if want := []string{"dev-0", "dev-2", "dev-4", "dev-6", "dev-8"}; err != nil || !slices.Equal(got.Devices, want) {
		t.Fatalf("Select region=eu of entries without terms: %+v, %v; want %q", got, err, want)
	}
	if n, err := IndexInventory(ctx, st); err != nil || n != 10 {
		t.Fatalf("IndexInventory = %d, %v; want 10", n, err)
	}
	if n, err := IndexInventory(ctx, st); err != nil || n != 0 {
		t.Fatalf("IndexInventory again = %d, %v; want 0", n, err)
	}
	docs, err := st.DocumentsByTerms(ctx, InventoryNamespace, []string{"label:region=eu"})
	if err != nil || len(docs) != 5 {
		t.Fatalf("entries by label:region=eu after IndexInventory: %d, %v; want the 5", len(docs), err)
	}
	if got2, err := Select(ctx, st, sel); err != nil || !slices.Equal(got2.Devices, got.Devices) {
		t.Fatalf("Select region=eu after IndexInventory: %+v, %v; want %q", got2, err, got.Devices)
	}
}

// forgetTerms makes st's inventory entries look as an upgrade from
// schema 12 leaves them: terms NULL, none in the index.
func forgetTerms(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`UPDATE documents SET terms = NULL WHERE namespace = ?`,
		`DELETE FROM leasepool_document_terms WHERE namespace = ?`,
	} {
		if _, err := db.Exec(q, InventoryNamespace); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
