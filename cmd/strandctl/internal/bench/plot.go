package bench

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"
)

// Mark is a labelled instant on the timeline.
type Mark struct {
	At    time.Duration
	Label string
	Color string
}

// PlotWidth is the bucket width of the timeline.
const PlotWidth = 100 * time.Millisecond

// WriteSVG draws confirmed records per bucket as bars over time, with the
// marks as vertical lines. It is hand-made SVG: no dependencies, viewable in
// any browser.
func WriteSVG(w io.Writer, title string, buckets []int, width time.Duration, marks []Mark) error {
	const (
		W, H                     = 1000.0, 360.0
		left, right, top, bottom = 70.0, 20.0, 40.0, 50.0
	)
	plotW, plotH := W-left-right, H-top-bottom
	peak := 1
	for _, b := range buckets {
		peak = max(peak, b)
	}
	n := max(1, len(buckets))
	barW := plotW / float64(n)
	span := time.Duration(n) * width
	x := func(d time.Duration) float64 { return left + plotW*float64(d)/float64(span) }
	y := func(v int) float64 { return top + plotH*(1-float64(v)/float64(peak)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="15">%s</text>`+"\n", left, html.EscapeString(title))
	// Bars.
	fmt.Fprintf(&b, `<g fill="#4a78c2">`+"\n")
	for i, v := range buckets {
		if v == 0 {
			continue
		}
		fmt.Fprintf(&b, `<rect class="bar" x="%.2f" y="%.2f" width="%.2f" height="%.2f"/>`+"\n", left+float64(i)*barW, y(v), max(barW-0.5, 0.5), top+plotH-y(v))
	}
	fmt.Fprintf(&b, "</g>\n")
	// Axes and ticks: a tick per second (or per 5 s on long runs).
	fmt.Fprintf(&b, `<g stroke="black"><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/></g>`+"\n",
		left, top+plotH, left+plotW, top+plotH, left, top, left, top+plotH)
	step := time.Second
	if span > 60*time.Second {
		step = 5 * time.Second
	}
	for t := time.Duration(0); t <= span; t += step {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%ds</text>`+"\n", x(t), top+plotH+16, int(t.Seconds()))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%d</text>`+"\n", left-6, top+4, peak)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">0</text>`+"\n", left-6, top+plotH+4)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">confirmed records per %v</text>`+"\n", left+plotW/2, H-10, width)
	// Marks.
	for i, m := range marks {
		color := m.Color
		if color == "" {
			color = "#c0392b"
		}
		mx := x(m.At)
		fmt.Fprintf(&b, `<line class="mark" x1="%.2f" y1="%.0f" x2="%.2f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="5,3"/>`+"\n", mx, top, mx, top+plotH, color)
		fmt.Fprintf(&b, `<text x="%.2f" y="%.0f" fill="%s">%s (%.2fs)</text>`+"\n", mx+4, top+14+float64(i)*14, color, html.EscapeString(m.Label), m.At.Seconds())
	}
	fmt.Fprintf(&b, "</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
