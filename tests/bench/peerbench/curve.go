package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/leasepool/leasepool/internal/bench"
)

// curveMain turns the points `leasepool bench curve --json` printed into
// a markdown table and a plot (throughput and claim latency against the
// backlog, one line per worker process count).
func curveMain(args []string) error {
	fs := flag.NewFlagSet("curve", flag.ExitOnError)
	in := fs.String("in", "curve.json", "`leasepool bench curve --json` output")
	md := fs.String("md", "curve.md", "markdown file to write")
	png := fs.String("png", "curve.png", "plot to write")
	command := fs.String("command", "tests/bench/curve", "the command that reproduces the table")
	fs.Parse(args)
	data, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var points []bench.CurvePoint
	if err := json.Unmarshal(data, &points); err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if len(points) == 0 {
		return fmt.Errorf("%s: no points", *in)
	}
	if err := plotCurve(points, *png); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# leasepool cost curve\n\nMeasured with `%s` (machine below). ", *command)
	b.WriteString("Each point: a store holding the pending noop tasks (and, in the last rows, a million finished ones) drained by that many `leasepool worker` processes at concurrency 32; throughput is timed from a tenth of the drain to its end; claim latency is publish (returned) to start of a higher-priority probe task published every 20 ms during the drain; RSS is the largest peak RSS of the point's workers.\n\n")
	fmt.Fprintf(&b, "![throughput and claim latency against the backlog](%s)\n\n", filepath.Base(*png))
	b.WriteString("| pending | finished | workers | drained | tasks/s | claim p50 ms | claim p99 ms | claim max ms | worker peak RSS MiB |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range points {
		fmt.Fprintf(&b, "| %d | %d | %d | %d | %.0f | %.2f | %.2f | %.2f | %.1f |\n", p.Pending, p.Finished, p.Workers, p.Drained,
			p.ThroughputPerS, p.ClaimP50Ms, p.ClaimP99Ms, p.ClaimMaxMs, float64(p.WorkerRSSBytes)/(1<<20))
	}
	b.WriteString("\n## Machine\n\n")
	b.WriteString(machine())
	fmt.Print(b.String())
	return os.WriteFile(*md, []byte(b.String()), 0o644)
}

// plotCurve draws throughput and claim p99 against the backlog (log
// scale), one line per worker count; points with finished tasks are left
// out (they share the smallest backlog).
func plotCurve(points []bench.CurvePoint, path string) error {
	byWorkers := map[int][]bench.CurvePoint{}
	for _, p := range points {
		if p.Finished == 0 {
			byWorkers[p.Workers] = append(byWorkers[p.Workers], p)
		}
	}
	workers := make([]int, 0, len(byWorkers))
	for w := range byWorkers {
		workers = append(workers, w)
	}
	slices.Sort(workers)
	panels := []struct {
		title, y string
		value    func(bench.CurvePoint) float64
	}{
		{"noop throughput", "tasks/s", func(p bench.CurvePoint) float64 { return p.ThroughputPerS }},
		{"claim latency p99 under that backlog", "ms", func(p bench.CurvePoint) float64 { return p.ClaimP99Ms }},
	}
	row := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.X.Label.Text = "pending tasks (log scale)"
		p.Y.Label.Text = pn.y
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Left = true // the bottom left is free: the lines run high
		for j, w := range workers {
			pts := make(plotter.XYs, 0, len(byWorkers[w]))
			for _, c := range byWorkers[w] {
				pts = append(pts, plotter.XY{X: float64(c.Pending), Y: pn.value(c)})
			}
			l, s, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			l.Color, s.Color = palette[j%len(palette)], palette[j%len(palette)]
			l.Width = vg.Points(1.5)
			p.Add(l, s)
			name := "1 worker process"
			if w > 1 {
				name = fmt.Sprintf("%d worker processes", w)
			}
			p.Legend.Add(name, l, s)
		}
		row[i] = p
	}
	img := vgimg.New(12*vg.Inch, 4.5*vg.Inch)
	dc := draw.New(img)
	canvases := plot.Align([][]*plot.Plot{row}, draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Points(12)}, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
