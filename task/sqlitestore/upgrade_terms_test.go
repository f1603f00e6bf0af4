package sqlitestore_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestUpgradeDocumentTerms opens testdata/v12-inventory.db, written by the
// program of schema version 12 (twenty devices in the inventory, with
// announced attributes, operator labels, sixteen vouched for, and one
// application document), before documents had terms. Its documents carry
// none, so DocumentsByTerms returns every one of them, read-only before
// the upgrade and after it, until a write gives a document its terms.
func TestUpgradeDocumentTerms(t *testing.T) {
	path := copyFixture(t, "v12-inventory.db")
	ctx := t.Context()
	ro, err := sqlitestore.Open(ctx, path, &sqlitestore.Config{ReadOnly: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("read-only open of a version 12 store: %v", err)
	}
	all := byTerm(t, ro, mqttdev.InventoryNamespace, "label:region=eu")
	checkV12Selection(t, "read-only, before the upgrade", ro)
	ro.Close()
	if len(all) != 20 {
		t.Fatalf("read-only, before the upgrade: %d documents by term; want all 20, stored before terms", len(all))
	}

	st := open(t, path, nil)
	db := rawDB(t, path)
	var v, unindexed int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`SELECT count(*) FROM documents INDEXED BY leasepool_documents_unindexed WHERE namespace = ? AND terms IS NULL`,
		mqttdev.InventoryNamespace).Scan(&unindexed); err != nil {
		t.Fatal(err)
	}
	if v != sqlitestore.SchemaVersion || unindexed != 20 {
		t.Fatalf("after the upgrade: version %d, %d inventory documents without terms; want %d, 20", v, unindexed, sqlitestore.SchemaVersion)
	}
	got := byTerm(t, st, mqttdev.InventoryNamespace, "label:region=eu")
	if !slices.Equal(got, all) {
		t.Fatalf("after the upgrade: by term %q; want every document %q", got, all)
	}
	checkV12Selection(t, "after the upgrade", st)

	// A write gives dev-00 terms: the queries it does not match leave it
	// out from now on, the others find it on the index.
	d, err := st.GetDocument(ctx, mqttdev.InventoryNamespace, "dev-00")
	if err != nil || d.Terms != nil {
		t.Fatalf("dev-00 before a write: terms %q, %v; want none", d.Terms, err)
	}
	d.Terms = []string{"label:region=eu", "attr:model=x", "attr:fw=1.0"} // as mqttdev writes them
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), d); err != nil {
		t.Fatal(err)
	}
	if got := byTerm(t, st, mqttdev.InventoryNamespace, "label:region=us"); len(got) != 19 || slices.Contains(got, "dev-00") {
		t.Fatalf("region=us after dev-00 got terms: %q; want the 19 others", got)
	}
	if got := byTerm(t, st, mqttdev.InventoryNamespace, "label:region=eu"); len(got) != 20 {
		t.Fatalf("region=eu after dev-00 got terms: %q; want all 20", got)
	}
	// Deleted, it leaves the partial index of documents without terms too.
	if err := st.DeleteDocument(ctx, mqttdev.InventoryNamespace, "dev-01", 0); err != nil {
		t.Fatal(err)
	}
	if got := byTerm(t, st, mqttdev.InventoryNamespace, "label:region=us"); len(got) != 18 || slices.Contains(got, "dev-01") {
		t.Fatalf("region=us after deleting dev-01: %q; want 18, without it", got)
	}
	// The application document, stored before terms too, stays readable.
	if app, err := st.GetDocument(ctx, "app", "a"); err != nil || app.Terms != nil || string(app.Value) != `{"n":1}` {
		t.Fatalf("app/a after the upgrade: %+v, %v", app, err)
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "app", ID: "a", Version: 1, Value: json.RawMessage(`2`), Terms: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	if got := byTerm(t, st, "app", "t"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("app by term t: %q; want [a]", got)
	}

	// The devices' entries get their terms: the 18 left without.
	if n, err := mqttdev.IndexInventory(ctx, st); err != nil || n != 18 {
		t.Fatalf("IndexInventory = %d, %v; want 18", n, err)
	}
	if got := byTerm(t, st, mqttdev.InventoryNamespace, "label:region=us"); len(got) != 10 || got[0] != "dev-10" {
		t.Fatalf("region=us after IndexInventory: %q; want dev-10..dev-19 alone", got)
	}
	sel, _ := mqttdev.ParseSelector("region=eu,attr:model=x")
	if got, err := mqttdev.Select(ctx, st, sel); err != nil || !slices.Equal(got.Devices, []string{"dev-00", "dev-02", "dev-06", "dev-08"}) ||
		!slices.Equal(got.New, []string{"dev-04"}) {
		t.Fatalf("Select %s after IndexInventory: %+v, %v", sel, got, err)
	}
}

// checkV12Selection checks what selectors pick of v12-inventory.db's
// devices (dev-00..19: region eu below 10, model x when even, dev-04,
// -09, -14 and -19 new), its entries stored without terms.
func checkV12Selection(t *testing.T, when string, st task.Store) {
	t.Helper()
	for s, want := range map[string][2][]string{
		"region=eu,attr:model=x":  {{"dev-00", "dev-02", "dev-06", "dev-08"}, {"dev-04"}},
		"region=us":               {{"dev-10", "dev-11", "dev-12", "dev-13", "dev-15", "dev-16", "dev-17", "dev-18"}, {"dev-14", "dev-19"}},
		"attr:model=y,region!=eu": {{"dev-11", "dev-13", "dev-15", "dev-17"}, {"dev-19"}},
	} {
		sel, err := mqttdev.ParseSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := mqttdev.Select(t.Context(), st, sel)
		if err != nil || !slices.Equal(got.Devices, want[0]) || !slices.Equal(got.New, want[1]) {
			t.Fatalf("%s: Select %s = %+v, %v; want devices %q, new %q", when, s, got, err, want[0], want[1])
		}
	}
}

func byTerm(t *testing.T, st task.Store, ns, term string) []string {
	t.Helper()
	docs, err := st.DocumentsByTerms(t.Context(), ns, []string{term})
	if err != nil {
		t.Fatalf("DocumentsByTerms %s %s: %v", ns, term, err)
	}
	var ids []string
	for _, d := range docs {
		ids = append(ids, d.ID)
	}
	return ids
}
