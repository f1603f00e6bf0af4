package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	fenceRE   = regexp.MustCompile("(?ms)^```.*?^```")
)

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown page's headings (outside code
// fences), numbered as GitHub numbers repeats.
func anchors(text string) map[string]bool {
	text = fenceRE.ReplaceAllString(text, "")
	out := make(map[string]bool)
	seen := make(map[string]int)
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// brokenLinks checks the relative links of the Markdown page at path (a
// path relative to root) and returns one line per broken link.
func brokenLinks(root, path string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return nil, err
	}
	text := fenceRE.ReplaceAllString(string(data), "")
	var out []string
	for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		resolved := path
		if file != "" {
			resolved = filepath.ToSlash(filepath.Join(filepath.Dir(path), file))
		}
		if fi, err := os.Stat(filepath.Join(root, resolved)); err == nil && fi.IsDir() {
			continue // a folder: GitHub lists it (an anchor names no heading there)
		}
		body, err := os.ReadFile(filepath.Join(root, resolved))
		if err != nil {
			out = append(out, path+": "+target+": "+resolved+" does not exist")
			continue
		}
		if anchor != "" && strings.HasSuffix(resolved, ".md") && !anchors(string(body))[anchor] {
			out = append(out, path+": "+target+": no heading #"+anchor+" in "+resolved)
		}
	}
	return out, nil
}

func TestDocLinks(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pages := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	records, err := filepath.Glob(filepath.Join(root, "docs", "decisions", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range append(docs, records...) {
		rel, _ := filepath.Rel(root, d)
		pages = append(pages, filepath.ToSlash(rel))
	}
	if len(docs) < 5 {
		t.Fatalf("found %d pages in docs/; the root is wrong (%s)", len(docs), root)
	}
	for _, p := range pages {
		if _, err := os.Stat(filepath.Join(root, p)); os.IsNotExist(err) && p == "CHANGELOG.md" {
			t.Errorf("%s is missing", p)
			continue
		}
		broken, err := brokenLinks(root, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range broken {
			t.Error(b)
		}
	}
}

// TestBrokenLinksAreFound: a page with a missing file, a missing anchor
// and good links reports exactly the two broken ones.
func TestBrokenLinksAreFound(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/b.md", "# B page\n\n## Pause, resume and rate limits\n\n## `leasepool bench`\n\n## Usage\n\n## Usage\n")
	write("docs/a.md", "# A\n\n## Here\n\n"+
		"[ok](b.md) [ok](b.md#pause-resume-and-rate-limits) [ok](b.md#leasepool-bench) [ok](b.md#usage-1) [ok](#here)\n"+
		"[ok](https://example.com/x.md) ![ok](../docs/b.md)\n"+
		"[bad](c.md) [bad](b.md#nope)\n```\n[in a fence](nowhere.md)\n```\n")
	got, err := brokenLinks(root, "docs/a.md")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"docs/a.md: c.md: docs/c.md does not exist",
		"docs/a.md: b.md#nope: no heading #nope in docs/b.md",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
