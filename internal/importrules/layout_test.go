package importrules

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layoutPackages reads the package list of docs/DESIGN.md's Layout: the
// fenced block opened by "```layout", one package a line, its
// module-relative path first; lines that start with a space continue the
// one before. It fails on a block that is missing, unclosed or lists a
// package twice, since any of those would make the comparison meaningless.
func layoutPackages(doc string) ([]string, error) {
	sc := bufio.NewScanner(strings.NewReader(doc))
	var pkgs []string
	in, found, line := false, false, 0
	for sc.Scan() {
		line++
		text := sc.Text()
		switch {
		case !in && strings.TrimSpace(text) == "```layout":
			if found {
				return nil, fmt.Errorf("line %d: a second layout block", line)
			}
			in, found = true, true
		case in && strings.HasPrefix(text, "```"):
			in = false
		case in && strings.TrimSpace(text) == "":
		case in && (text[0] == ' ' || text[0] == '\t'):
			if len(pkgs) == 0 {
				return nil, fmt.Errorf("line %d: a continuation line before any package", line)
			}
		case in:
			p := strings.TrimSuffix(strings.Fields(text)[0], "/")
			if slices.Contains(pkgs, p) {
				return nil, fmt.Errorf("line %d: package %s listed twice", line, p)
			}
			pkgs = append(pkgs, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no ```layout block")
	}
	if in {
		return nil, fmt.Errorf("the layout block is not closed")
	}
	return pkgs, nil
}

// layoutDiff compares the documented packages with the real ones and
// returns one line per difference, in a stable order. An entry "p/..."
// stands for p and every package under it, as in go list; it must match
// at least one.
func layoutDiff(documented []string, real map[string]pkg) []string {
	covers := func(entry, p string) bool {
		if prefix, ok := strings.CutSuffix(entry, "/..."); ok {
			return under(prefix)(p)
		}
		return entry == p
	}
	var out []string
	for _, d := range documented {
		found := false
		for p := range real {
			found = found || covers(d, p)
		}
		if !found {
			out = append(out, "docs/DESIGN.md lists "+d+", which go list does not report")
		}
	}
	var missing []string
	for p := range real {
		if p != "." && !slices.ContainsFunc(documented, func(d string) bool { return covers(d, p) }) {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	for _, p := range missing {
		out = append(out, "package "+p+" is missing from docs/DESIGN.md's Layout")
	}
	return out
}

// TestLayoutListsEveryPackage keeps docs/DESIGN.md's Layout true: every
// package go list reports is listed there, and every entry there is a
// package.
func TestLayoutListsEveryPackage(t *testing.T) {
	graph, err := loadGraph()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := graph["task"]; !ok {
		t.Fatal("go list did not report package task; the graph read is incomplete")
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented, err := layoutPackages(string(doc))
	if err != nil {
		t.Fatalf("docs/DESIGN.md: %v", err)
	}
	for _, d := range layoutDiff(documented, graph) {
		t.Error(d)
	}
}

// TestLayoutDiffFindsBothWays: a package missing from the doc and a doc
// entry with no package are each reported, and continuation lines, a
// trailing slash and a "/..." entry are read as the docs write them.
func TestLayoutDiffFindsBothWays(t *testing.T) {
	doc := "# x\n\n```\nnot/this\n```\n\n```layout\ntask/    the model\n" +
		"consumer the pool,\n         continued\n\ngone     no such package\n" +
		"vendored/... a tree of packages\nnone/...  no such tree\n```\n"
	got, err := layoutPackages(doc)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"task", "consumer", "gone", "vendored/...", "none/..."}; !slices.Equal(got, want) {
		t.Fatalf("layoutPackages = %q, want %q", got, want)
	}
	real := map[string]pkg{".": {}, "task": {}, "consumer": {}, "web": {},
		"vendored": {}, "vendored/sub": {}, "vendoredx": {}}
	want := []string{
		"docs/DESIGN.md lists gone, which go list does not report",
		"docs/DESIGN.md lists none/..., which go list does not report",
		"package vendoredx is missing from docs/DESIGN.md's Layout",
		"package web is missing from docs/DESIGN.md's Layout",
	}
	if d := layoutDiff(got, real); !slices.Equal(d, want) {
		t.Errorf("layoutDiff = %q, want %q", d, want)
	}
	for _, bad := range []string{
		"no block here\n",
		"```layout\ntask x\n",
		"```layout\ntask x\ntask y\n```\n",
		"```layout\n  continued first\n```\n",
		"```layout\ntask\n```\n```layout\nweb\n```\n",
	} {
		if _, err := layoutPackages(bad); err == nil {
			t.Errorf("layoutPackages(%q) accepted a malformed layout", bad)
		}
	}
}
