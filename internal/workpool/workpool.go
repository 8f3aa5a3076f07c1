// Package workpool runs functions on goroutines that outlive them.
//
// A worker keeps the stack it grew running one function for the next,
// where a goroutine per function grows a new stack each time: under load
// runtime.newstack took a tenth of a node's CPU serving pipelined
// requests, and a twentieth fanning out a transaction's prepares and
// resolves, that way. A function that finds no idle worker gets a new
// one; a worker idle for IdleTimeout exits.
package workpool

import "time"

// IdleTimeout is how long a worker waits for a function before it exits.
const IdleTimeout = 30 * time.Second

// Pool is a set of workers. The zero Pool is not usable: call New.
type Pool struct {
	work chan func()
}

// New returns an empty pool.
func New() *Pool { return &Pool{work: make(chan func())} }

// Go runs f on an idle worker, or on a new one; it does not wait for f.
func (p *Pool) Go(f func()) {
	select {
	case p.work <- f:
	default:
		go p.worker(f)
	}
}

func (p *Pool) worker(f func()) {
	f()
	t := time.NewTimer(IdleTimeout)
	defer t.Stop()
	for {
		select {
		case f := <-p.work:
			f()
			t.Reset(IdleTimeout)
		case <-t.C:
			return
		}
	}
}
