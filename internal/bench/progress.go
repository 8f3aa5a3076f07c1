package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// ProgressBar draws Status updates as a one-line bar on a terminal:
//
//	run    a [==============>          ]  58%  12.3s/30s   412330 ops  13402 ops/s  0 err
//
// Its Update method is an Options.Progress.
type ProgressBar struct {
	w     io.Writer
	width int // of the bar, in characters
	mu    struct {
		sync.Mutex
		// lastOps and lastAt are the ops count and time of the previous
		// update of the same phase, for the current rate.
		lastOps   int64
		lastAt    time.Time
		lastPhase string
		rate      float64
	}
}

// NewProgressBar returns a bar that writes to w (a terminal: it redraws the
// line with a carriage return).
func NewProgressBar(w io.Writer) *ProgressBar { return &ProgressBar{w: w, width: 30} }

// Update draws s; the last update of a phase ends the line.
func (p *ProgressBar) Update(s Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	phase := s.Phase + s.Workload
	if phase != p.mu.lastPhase {
		p.mu.lastPhase, p.mu.lastOps, p.mu.lastAt, p.mu.rate = phase, s.Ops, now, 0
	}
	if dt := now.Sub(p.mu.lastAt).Seconds(); dt >= 0.2 {
		p.mu.rate = float64(s.Ops-p.mu.lastOps) / dt
		p.mu.lastOps, p.mu.lastAt = s.Ops, now
	}
	frac := 1.0
	if s.Total > 0 {
		frac = min(1, float64(s.Elapsed)/float64(s.Total))
	}
	if s.Done {
		frac = 1
	}
	filled := int(frac * float64(p.width))
	bar := strings.Repeat("=", filled)
	if filled < p.width {
		bar += ">" + strings.Repeat(" ", p.width-filled-1)
	}
	var line string
	if s.Phase == "load" {
		line = fmt.Sprintf("\r%-6s %-13s [%s] %3.0f%%  %d/%d records  %.0f/s ", s.Phase, s.Workload, bar, frac*100, s.Ops, int64(s.Total), p.mu.rate)
	} else {
		line = fmt.Sprintf("\r%-6s %-13s [%s] %3.0f%%  %5.1fs/%.0fs  %9d ops  %7.0f ops/s  %d err ",
			s.Phase, s.Workload, bar, frac*100, s.Elapsed.Seconds(), s.Total.Seconds(), s.Ops, p.mu.rate, s.Errors)
	}
	if s.Done {
		line += "\n"
	}
	io.WriteString(p.w, line)
}
