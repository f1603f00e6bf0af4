package web_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/trigger"
	"github.com/leasepool/leasepool/web"
)

// newMongoEnv is newEnv on a database of its own on the MongoDB test
// server (triggers need one), with a collection "orders".
func newMongoEnv(t *testing.T) (*env, *mongostore.Store) {
	t.Helper()
	st, err := mongostore.Open(t.Context(), testservers.MongoURI(t),
		&mongostore.Config{Database: fmt.Sprintf("lp_web_%d", time.Now().UnixNano()%1e12)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Database().Drop(ctx)
		_ = st.Close()
	})
	if err := st.Database().CreateCollection(t.Context(), "orders"); err != nil {
		t.Fatal(err)
	}
	h, err := web.NewHandler(web.Config{Store: st, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &env{t: t, store: st, srv: srv, token: token}, st
}

func TestTriggers(t *testing.T) {
	e, st := newMongoEnv(t)
	coll := st.Database().Name() + ".orders"
	body := `{"name":"neworders","collection":"` + coll + `","filter":{"status":"new"},"operations":["insert"],` +
		`"kind":"order","options":{"priority":2,"lock_keys":["orders"],"max_unexpected_retries":0}}`
	e.want("POST", "/api/v1/triggers", body, 201, `"name":"neworders"`)
	e.want("POST", "/api/v1/triggers", body, 409, "trigger exists")
	out := e.want("GET", "/api/v1/triggers", "", 200, `"collection":"`+coll+`"`)
	for _, sub := range []string{`"filter":{"status":"new"}`, `"priority":2`, `"lock_keys":["orders"]`, `"position":`} {
		if !strings.Contains(out, sub) {
			t.Errorf("GET /api/v1/triggers = %s, want %s", out, sub)
		}
	}
	e.want("POST", "/api/v1/triggers/neworders/pause", "", 200, `"paused":true`)
	e.want("POST", "/api/v1/triggers/neworders/resume", "", 200, `"name":"neworders"`)
	if tr, err := trigger.Get(t.Context(), st, "neworders"); err != nil || tr.Paused {
		t.Fatalf("after resume: %+v %v", tr, err)
	}
	e.want("DELETE", "/api/v1/triggers/neworders", "", 200, `"changed":true`)
	e.want("DELETE", "/api/v1/triggers/neworders", "", 404, "trigger not found")
	e.want("POST", "/api/v1/triggers/nope/pause", "", 404, "trigger not found")

	// Bad input: 400 naming the field, nothing written.
	db := st.Database().Name()
	for _, c := range []struct{ body, want string }{
		{`{"name":"b","collection":"` + db + `.missing","kind":"k"}`, "collection: " + db + ".missing does not exist"},
		{`{"name":"b","collection":"` + db + `.tasks","kind":"k"}`, "leasepool's own"},
		{`{"name":"b","collection":"` + coll + `","filter":"{\"a\":","kind":"k"}`, "filter: is not a JSON object"},
		{`{"name":"b","collection":"` + coll + `","filter":{"a":{"$bad":1}},"kind":"k"}`, "filter.a: $bad is not a query operator"},
		{`{"name":"b","collection":"` + coll + `","operations":["drop"],"kind":"k"}`, "operations:"},
		{`{"name":"b","collection":"` + coll + `","kind":"k","paused":true}`, "body:"},
		{`{"name":"b","collection":"` + coll + `","kind":"k","options":{"max_unexpected_retries":-1}}`, "options.max_unexpected_retries"},
	} {
		e.want("POST", "/api/v1/triggers", c.body, 400, c.want)
	}
	if list, err := trigger.List(t.Context(), st); err != nil || len(list) != 0 {
		t.Errorf("triggers after refused posts: %v %v", list, err)
	}
}

// On the embedded store there are no collections to watch: a trigger
// names a table of its file.
func TestTriggersOnTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("POST", "/api/v1/triggers", `{"name":"b","collection":"app.orders","kind":"k"}`, 400, "collection: the embedded store has tables")
	e.want("POST", "/api/v1/triggers", `{"name":"b","table":"orders","kind":"k"}`, 400, "table: no table orders")
	e.want("GET", "/api/v1/triggers", "", 200, `[]`)
	st := e.store.(*sqlitestore.Store)
	if err := st.InTx(t.Context(), func(tx *sqlitestore.Tx) error {
		_, err := tx.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.want("POST", "/api/v1/triggers", `{"name":"b","table":"orders","filter":{"state":"new"},"kind":"k"}`, 400, "filter: table orders has no column state")
	e.want("POST", "/api/v1/triggers", `{"name":"b","table":"orders","filter":{"status":"new"},"kind":"k"}`, 201, `"table":"orders"`)
	e.want("GET", "/api/v1/triggers", "", 200, `"operations":["insert","update"]`)
	e.want("POST", "/api/v1/triggers/b/pause", "", 200, `"paused":true`)
	e.want("DELETE", "/api/v1/triggers/b", "", 200, `"changed":true`)
	e.want("GET", "/api/v1/triggers", "", 200, `[]`)
}
