package main

// publish --file: many tasks from JSON lines, each line the body of POST
// /api/v1/tasks, published in chunks through task.PublishMany.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// Bounds of publish --file: the lines published at once (one PublishMany)
// and the longest line, a publish body as the API bounds it.
const (
	fileChunk   = 5000
	maxFileLine = task.MaxPayloadSize + 64<<10
)

// fileLine is one line to publish: its number and its params.
type fileLine struct {
	n int
	p task.PublishParams
}

// fileTally counts a publish --file's outcomes.
type fileTally struct {
	lines, inserted, existing, rerun, debounced, refused, failed int
}

// publishFile publishes every line of --file (- for standard input),
// reporting each refused line on stderr and going on with the others.
func publishFile(c *cli.Context) error {
	if c.NArg() != 0 {
		return badUsage(c, "--file takes no KEY argument (each line has its key)")
	}
	for _, name := range append([]string{"delay", "rerun", "debounce", "json"}, taskFlagNames()...) {
		if name != "strict" && c.IsSet(name) {
			return badUsage(c, "--%s does not go with --file: each line gives its task's fields", name)
		}
	}
	ctx, err := publishContext(c)
	if err != nil {
		return err
	}
	in, name := c.App.Reader, "standard input"
	if f := c.String("file"); f != "-" {
		fh, err := os.Open(f)
		if err != nil {
			return &usageError{cmd: c.Command.HelpName, err: fmt.Errorf("%w: file: %v", task.ErrInvalid, err)}
		}
		defer fh.Close()
		in, name = fh, f
	}
	s, err := openStore(c, false)
	if err != nil {
		return err
	}
	defer s.Close()
	var tally fileTally
	kinds := map[string]bool{}
	var refs []kindRef
	began := time.Now()
	shown := began // progress, once a second for a long file
	rd := bufio.NewReaderSize(in, 64<<10)
	chunk := make([]fileLine, 0, fileChunk)
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		if c.Bool("strict") {
			var err error
			if chunk, err = refuseFileKinds(c, s, chunk, &tally); err != nil {
				return err
			}
		}
		ps := make([]task.PublishParams, len(chunk))
		for i, l := range chunk {
			ps[i] = l.p
		}
		out, err := task.PublishMany(ctx, s, ps)
		for i, o := range out {
			switch {
			case o.Err != nil:
				if errors.Is(o.Err, task.ErrInvalid) {
					tally.refused++
				} else {
					tally.failed++
				}
				fmt.Fprintf(c.App.ErrWriter, "line %d: %s\n", chunk[i].n, refusal(o.Err))
			case o.Result == task.Inserted:
				tally.inserted++
			case o.Result == task.Rerun:
				tally.rerun++
			case o.Result == task.Debounced:
				tally.debounced++
			default:
				tally.existing++
			}
		}
		chunk = chunk[:0]
		if time.Since(shown) >= time.Second || err != nil {
			shown = time.Now()
			fmt.Fprintf(c.App.ErrWriter, "%s: %d lines read, %.0f tasks/s\n", name, tally.lines, float64(tally.lines)/time.Since(began).Seconds())
		}
		return err
	}
	for n := 1; ; n++ {
		line, err := readLine(rd)
		if errors.Is(err, io.EOF) && line == nil {
			break
		}
		switch {
		case errors.Is(err, errLongLine):
			tally.lines++
			tally.refused++
			fmt.Fprintf(c.App.ErrWriter, "line %d: longer than %d bytes\n", n, maxFileLine)
			continue
		case err != nil && !errors.Is(err, io.EOF):
			return fmt.Errorf("read %s: line %d: %w", name, n, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		tally.lines++
		p, perr := web.ParsePublish(line, s.Now())
		if perr != nil {
			tally.refused++
			fmt.Fprintf(c.App.ErrWriter, "line %d: %s\n", n, refusal(perr))
			continue
		}
		if !kinds[p.Kind] && len(kinds) < 1000 {
			kinds[p.Kind] = true
			refs = append(refs, kindRef{"kind", p.Kind})
		}
		chunk = append(chunk, fileLine{n, p})
		if len(chunk) == fileChunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if !c.Bool("strict") && len(refs) > 0 {
		warnKindsWithoutWorker(c, s, refs)
	}
	debounced := ""
	if tally.debounced > 0 {
		debounced = fmt.Sprintf(", debounced %d", tally.debounced)
	}
	fmt.Fprintf(c.App.Writer, "inserted %d, existing %d, rerun %d%s, refused %d, failed %d (%d lines)\n",
		tally.inserted, tally.existing, tally.rerun, debounced, tally.refused, tally.failed, tally.lines)
	if bad := tally.refused + tally.failed; bad > 0 {
		return fmt.Errorf("%d of %d lines not published (see above)", bad, tally.lines)
	}
	return nil
}

// refuseFileKinds refuses, under --strict, the lines of chunk whose kind
// no live worker runs, and returns the others.
func refuseFileKinds(c *cli.Context, s task.Store, chunk []fileLine, tally *fileTally) ([]fileLine, error) {
	var kinds []string
	for _, l := range chunk {
		kinds = append(kinds, l.p.Kind)
	}
	missing, err := task.KindsWithoutWorker(c.Context, s, s.Now(), kinds...)
	if err != nil || len(missing) == 0 {
		return chunk, err
	}
	no := map[string]task.NoWorker{}
	for _, n := range missing {
		no[n.Kind] = n
	}
	keep := chunk[:0]
	for _, l := range chunk {
		if n, ok := no[l.p.Kind]; ok {
			tally.refused++
			fmt.Fprintf(c.App.ErrWriter, "line %d: %s\n", l.n, refusal(n.Refusal("kind")))
			continue
		}
		keep = append(keep, l)
	}
	return keep, nil
}

// refusal is err as a line of publish --file's report.
func refusal(err error) string {
	return strings.TrimPrefix(oneLine(err), task.ErrInvalid.Error()+": ")
}

var errLongLine = errors.New("line too long")

// readLine returns the next line of rd without its newline, or
// errLongLine (having skipped it) when it is longer than maxFileLine, or
// io.EOF (with the last line, if it had no newline).
func readLine(rd *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := rd.ReadSlice('\n')
		if len(line)+len(frag) > maxFileLine+1 {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = rd.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errLongLine
		}
		line = append(line, frag...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(line) == 0 {
				return nil, io.EOF
			}
			return line, io.EOF
		case err != nil:
			return nil, err
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}
