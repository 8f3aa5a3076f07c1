package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// ChartOptions size a chart. The zero value means the defaults.
type ChartOptions struct {
	// Width and Height are the image size in pixels; 0 means 1200 by 900,
	// room for six workloads of three systems with labels that stay
	// legible when a page scales the image down.
	Width, Height int
	// Title heads the chart; "" means one made of the systems and the
	// parameters of the first result.
	Title string
}

// EnsureDefaults fills the defaults of zero fields.
func (o *ChartOptions) EnsureDefaults() {
	if o.Width == 0 {
		o.Width = 1200
	}
	if o.Height == 0 {
		o.Height = 900
	}
}

// Validate reports every problem of o.
func (o *ChartOptions) Validate() error {
	var errs []string
	if o.Width < 400 || o.Width > 8000 {
		errs = append(errs, fmt.Sprintf("width %d: use 400 to 8000 pixels", o.Width))
	}
	if o.Height < 300 || o.Height > 8000 {
		errs = append(errs, fmt.Sprintf("height %d: use 300 to 8000 pixels", o.Height))
	}
	return joinProblems("chart", errs)
}

// palette colors the systems in legend order (Tableau 10).
var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x8c, 0x56, 0x4b, 0xff}, // brown
}

var (
	black = color.RGBA{0x20, 0x20, 0x20, 0xff}
	grey  = color.RGBA{0x40, 0x40, 0x40, 0xff}
	light = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
	white = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

// WriteChartPNG draws rs (the latest result of each system and workload)
// as two bar charts, throughput and p99 latency per workload with one bar
// per system, and writes the PNG to w.
func WriteChartPNG(w io.Writer, rs []Result, opts ChartOptions) error {
	img, err := Chart(rs, opts)
	if err != nil {
		return err
	}
	return png.Encode(w, img)
}

// Chart draws rs like WriteChartPNG and returns the image.
func Chart(rs []Result, opts ChartOptions) (*image.RGBA, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	rs = MedianResults(rs)
	if len(rs) == 0 {
		return nil, ErrNoResults
	}
	W, H := opts.Width, opts.Height
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)

	systems, workloads := systemsOf(rs), workloadsOf(rs)
	title := opts.Title
	if title == "" {
		p := rs[0].Params
		title = fmt.Sprintf("%s: %d clients, %d B values, %d records, %.0fs per run",
			strings.Join(systems, " vs "), p.Clients, p.ValueSize, p.Records, p.DurationSeconds)
	}
	y := 16
	drawText(img, W/2, y, title, black, 2, alignCenter)
	y += 2*13 + 14

	// Legend: a swatch and "system version" per system, centered.
	var items []string
	for _, s := range systems {
		v := ""
		for _, r := range rs {
			if r.System == s {
				v = r.Version
				break
			}
		}
		items = append(items, strings.TrimSpace(s+" "+v))
	}
	const sw, gap = 18, 36
	total := 0
	for _, it := range items {
		total += sw + 8 + textWidth(it, 2) + gap
	}
	x := (W - total + gap) / 2
	for i, it := range items {
		fillRect(img, image.Rect(x, y+4, x+sw, y+4+sw), palette[i%len(palette)])
		x += sw + 8
		x += drawText(img, x, y, it, black, 2, alignLeft) + gap
	}
	y += 2*13 + 16

	panelH := (H - y - 10) / 2
	drawPanel(img, image.Rect(0, y, W, y+panelH), "Throughput (operations/s, higher is better)",
		rs, systems, workloads, func(r Result) float64 { return r.OpsPerSec }, fmtRate)
	drawPanel(img, image.Rect(0, y+panelH+10, W, H), "p99 latency of all operations (ms, lower is better)",
		rs, systems, workloads, func(r Result) float64 { return r.Latency[AllOps].P99Us / 1000 }, fmtMs)
	return img, nil
}

// drawPanel draws one bar chart of value(result) in area.
func drawPanel(img *image.RGBA, area image.Rectangle, title string, rs []Result, systems, workloads []string,
	value func(Result) float64, format func(float64) string) {
	drawText(img, area.Min.X+20, area.Min.Y, title, black, 2, alignLeft)
	// Plot area: room on the left for tick labels, below for workloads.
	plot := image.Rect(area.Min.X+80, area.Min.Y+2*13+16, area.Max.X-20, area.Max.Y-2*13-14)

	maxV := 0.0
	for _, r := range rs {
		maxV = math.Max(maxV, value(r))
	}
	step, top := niceScale(maxV, 5)
	yOf := func(v float64) int {
		return plot.Max.Y - int(math.Round(v/top*float64(plot.Dy())))
	}
	for v := 0.0; v <= top*1.0001; v += step {
		yy := yOf(v)
		fillRect(img, image.Rect(plot.Min.X, yy, plot.Max.X, yy+1), light)
		drawText(img, plot.Min.X-8, yy-6, format(v), grey, 1, alignRight)
	}

	groupW := float64(plot.Dx()) / float64(len(workloads))
	barW := math.Min(groupW*0.8/float64(len(systems)), 90)
	// Value labels are large if every one fits over its bar with room to
	// spare, else all small: one size per panel reads best.
	labelScale := 2
	for _, r := range rs {
		if textWidth(format(value(r)), 2) > int(barW)-3-8 {
			labelScale = 1
		}
	}
	for wi, wl := range workloads {
		gx := float64(plot.Min.X) + groupW*float64(wi)
		start := gx + (groupW-barW*float64(len(systems)))/2
		for si, s := range systems {
			r, ok := find(rs, s, wl)
			if !ok {
				continue
			}
			v := value(r)
			x0 := int(start + barW*float64(si))
			x1 := int(start+barW*float64(si+1)) - 3
			fillRect(img, image.Rect(x0, yOf(v), x1, plot.Max.Y), palette[si%len(palette)])
			drawText(img, (x0+x1)/2, yOf(v)-13*labelScale-3, format(v), black, labelScale, alignCenter)
		}
		drawText(img, int(gx+groupW/2), plot.Max.Y+8, workloadLabel(wl), black, 2, alignCenter)
	}
	// The axes, over the bars' feet.
	fillRect(img, image.Rect(plot.Min.X, plot.Max.Y, plot.Max.X, plot.Max.Y+2), black)
	fillRect(img, image.Rect(plot.Min.X-2, plot.Min.Y, plot.Min.X, plot.Max.Y+2), black)
}

func workloadLabel(w string) string {
	if len(w) == 1 {
		return "workload " + strings.ToUpper(w)
	}
	return w
}

// niceScale returns a tick step of 1, 2 or 5 times a power of ten giving
// about n ticks up to max, and the top of the axis, a multiple of the step
// at or above max.
func niceScale(max float64, n int) (step, top float64) {
	if max <= 0 || math.IsNaN(max) || math.IsInf(max, 0) {
		return 1, float64(n)
	}
	raw := max / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		step = p
	case f <= 2:
		step = 2 * p
	case f <= 5:
		step = 5 * p
	default:
		step = 10 * p
	}
	top = math.Ceil(max/step) * step
	if top < max*1.08 { // room for the value labels above the tallest bar
		top += step
	}
	return step, top
}

// fmtRate writes a rate in two or three digits (the tables have the exact
// figures; a chart label must be short to sit over a bar).
func fmtRate(v float64) string {
	switch {
	case v >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

func fmtMs(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return trimZero(fmt.Sprintf("%.1f", v))
	default:
		return trimZero(fmt.Sprintf("%.2f", v))
	}
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func fillRect(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	draw.Draw(img, r.Intersect(img.Bounds()), image.NewUniform(c), image.Point{}, draw.Src)
}

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

// textWidth is the width of s drawn by drawText at scale.
func textWidth(s string, scale int) int {
	return font.MeasureString(basicfont.Face7x13, s).Ceil() * scale
}

// drawText draws s with its top at y, its left, center or right at x, in
// the 7x13 bitmap font enlarged scale times (nearest neighbour: crisp), and
// answers its width.
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA, scale int, a align) int {
	face := basicfont.Face7x13
	w := font.MeasureString(face, s).Ceil()
	h := face.Height
	mask := image.NewAlpha(image.Rect(0, 0, w, h))
	d := font.Drawer{Dst: mask, Src: image.Opaque, Face: face, Dot: fixed.P(0, face.Ascent)}
	d.DrawString(s)
	switch a {
	case alignCenter:
		x -= w * scale / 2
	case alignRight:
		x -= w * scale
	}
	src := image.NewUniform(c)
	for py := 0; py < h; py++ {
		for px := 0; px < w; px++ {
			if mask.AlphaAt(px, py).A < 0x80 {
				continue
			}
			r := image.Rect(x+px*scale, y+py*scale, x+(px+1)*scale, y+(py+1)*scale)
			draw.Draw(img, r.Intersect(img.Bounds()), src, image.Point{}, draw.Src)
		}
	}
	return w * scale
}
