package main

// Progress output of the long commands (demo, bench): on a terminal one
// status line rewritten in place; anywhere else (a pipe, a file, a CI log)
// plain lines, at most one every progressEvery, with no control
// characters, so a log holds a readable line per few seconds instead of
// one line of thousands of characters joined by carriage returns.

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mattn/go-isatty"
)

// progressEvery is how often a status line is written when the output is
// not a terminal.
const progressEvery = 3 * time.Second

// maxStatusLen bounds a status line, in characters: a longer line wraps on
// a terminal, where a carriage return then cannot rewrite it.
const maxStatusLen = 200

// progress writes a changing status and lasting lines between them. It is
// safe for concurrent use.
type progress struct {
	w     io.Writer
	tty   bool
	every time.Duration

	mu sync.Mutex
	// On a terminal: a status is on the current line, not ended.
	shown bool
	// Elsewhere: when the last status line was written, the newest status
	// not written yet, and the timer that writes it when its turn comes.
	last   time.Time
	held   string
	timer  *time.Timer
	closed bool
}

// newProgress writes progress to w, in place if w is a terminal.
func newProgress(w io.Writer) *progress {
	return &progress{w: w, tty: isTerminal(w), every: progressEvery}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// Status replaces the status. On a terminal it is shown at once; elsewhere
// the first status is written at once, then at most one line per interval:
// the newest, written when its turn comes even if no other follows.
func (p *progress) Status(s string) {
	s = statusText(s)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K"+s)
		p.shown = true
		return
	}
	now := time.Now()
	if p.last.IsZero() || now.Sub(p.last) >= p.every {
		p.writeLine(s, now)
		return
	}
	p.held = s
	if p.timer == nil {
		p.timer = time.AfterFunc(p.last.Add(p.every).Sub(now), p.flush)
	}
}

// flush writes the held status when its turn comes.
func (p *progress) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.timer = nil
	if p.held != "" && !p.closed {
		p.writeLine(p.held, time.Now())
	}
}

func (p *progress) writeLine(s string, now time.Time) {
	fmt.Fprintln(p.w, s)
	p.last, p.held = now, ""
}

// Println writes a line that stays, below the status a terminal shows; a
// status held back for its turn is dropped (a newer one follows).
func (p *progress) Println(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endStatus()
	fmt.Fprintln(p.w, plainText(s))
}

// Done replaces the status with a last line that stays, and ends the
// progress.
func (p *progress) Done(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
	p.held = ""
	p.close()
	fmt.Fprintln(p.w, plainText(s))
}

// Close ends the progress: a terminal's status line is ended, and a
// status held back for its turn is written.
func (p *progress) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != "" && !p.closed {
		p.writeLine(p.held, time.Now())
	}
	p.endStatus()
	p.close()
}

func (p *progress) endStatus() {
	if p.tty && p.shown {
		fmt.Fprintln(p.w)
		p.shown = false
	}
	p.held = ""
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

func (p *progress) close() {
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// progressWriter is an io.Writer for a package that writes its own
// progress as "\r\033[K" followed by the status, each in one Write, and a
// last line ending in a newline (package bench): it passes them through a
// progress, which writes plain lines where the output is not a terminal.
type progressWriter struct{ p *progress }

func (pw progressWriter) Write(b []byte) (int, error) {
	s := string(b)
	if strings.HasSuffix(s, "\n") {
		pw.p.Done(strings.TrimSuffix(s, "\n"))
	} else {
		pw.p.Status(s)
	}
	return len(b), nil
}

// ansiEscape matches a terminal control sequence (CSI), such as an erase.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// plainText is s without terminal control sequences and control
// characters (a carriage return, a tab...).
func plainText(s string) string {
	s = ansiEscape.ReplaceAllString(s, "")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}

// statusText is s as plainText without spaces at either end, cut to
// maxStatusLen characters.
func statusText(s string) string {
	s = strings.TrimSpace(plainText(s))
	if utf8.RuneCountInString(s) <= maxStatusLen {
		return s
	}
	r := []rune(s)
	return string(r[:maxStatusLen-1]) + "…"
}
