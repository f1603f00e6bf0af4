package sqlitestore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocumentsByTermsPlan checks that DocumentsByTerms reads a term's
// ids off the index and each document by its key, for one term and for
// several: never a walk of the namespace's documents.
func TestDocumentsByTermsPlan(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for n := 1; n <= 3; n++ {
		args := []any{}
		for range n {
			args = append(args, "ns", "term")
		}
		args = append(args, "ns", "ns")
		rows, err := s.rdb.Query(`EXPLAIN QUERY PLAN `+documentsByTermsSQL(n), args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		all := strings.Join(plan, "\n")
		for _, want := range []string{
			"SEARCH leasepool_document_terms USING PRIMARY KEY (namespace=? AND term=?)",
			"SEARCH d USING PRIMARY KEY (namespace=? AND id=?)",
			"SEARCH documents USING INDEX leasepool_documents_unindexed (namespace=?)",
		} {
			if !strings.Contains(all, want) {
				t.Errorf("%d terms: plan lacks %q:\n%s", n, want, all)
			}
		}
		for _, step := range plan {
			if strings.HasPrefix(step, "SCAN d") || step == "SEARCH d USING PRIMARY KEY (namespace=?)" {
				t.Errorf("%d terms: plan walks the namespace's documents:\n%s", n, all)
			}
		}
	}
}
