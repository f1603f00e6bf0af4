// Package doccheck holds the test that keeps the repository's Markdown
// links working: every relative link in README.md, CHANGELOG.md, docs/
// and docs/decisions/ names a file that exists, and every #anchor a
// heading of its page. It has no code of its own.
package doccheck
