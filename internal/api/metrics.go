package api

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/groupkv/groupkv/internal/kv"
)

// Metrics counts and times the requests of the API layers. The HTTP and the
// gRPC layer of one node share one Metrics, so a series says which operation
// was asked for, not which protocol carried it.
//
// A nil *Metrics is valid and records nothing.
type Metrics struct {
	// requests is groupkv_requests_total{op,code}.
	requests *prometheus.CounterVec
	// duration is groupkv_request_duration_seconds{op}.
	duration *prometheus.HistogramVec
	// ok holds the series of each op's successful requests (its ok count
	// and its duration), by op, so that most requests look up no labels.
	ok sync.Map // string -> *okSeries
}

type okSeries struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// codeOK is the code label of a request that succeeded. It is a metrics
// label only, never an error code on the wire.
const codeOK = "ok"

// durationBuckets span 100µs to about 6.5s: a put on one node costs an
// fsync (hundreds of µs to a few ms), a cross-shard operation a few network
// round trips, and anything beyond seconds is a stall worth seeing as such.
var durationBuckets = prometheus.ExponentialBuckets(0.0001, 2, 17)

// NewMetrics creates the collectors and registers them with reg. When reg
// already holds collectors of the same names and labels (a second NewMetrics
// on one registry), they are reused, so both Metrics feed the same series. A
// nil reg creates collectors that are registered nowhere, which is useful in
// tests. NewMetrics panics if reg holds different collectors under these
// names, as prometheus.MustRegister would.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "groupkv_requests_total",
		Help: "Requests served by the API layers, by operation and result code (ok on success).",
	}, []string{"op", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "groupkv_request_duration_seconds",
		Help:    "Time to serve a request of the API layers, by operation, failures included.",
		Buckets: durationBuckets,
	}, []string{"op"})
	if reg != nil {
		requests = register(reg, requests)
		duration = register(reg, duration)
	}
	return &Metrics{requests: requests, duration: duration}
}

// register registers c with reg, or answers the equal collector reg already
// holds.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}

// Observe records one request of operation op (a short snake_case verb such
// as "put" or "create_collection") that ended with code after seconds. code
// is "" for a request that succeeded; it is recorded as "ok". Observe is safe
// for concurrent use and does nothing on a nil Metrics.
func (m *Metrics) Observe(op string, code kv.Code, seconds float64) {
	if m == nil {
		return
	}
	if code == "" {
		v, found := m.ok.Load(op)
		if !found {
			v, _ = m.ok.LoadOrStore(op, &okSeries{requests: m.requests.WithLabelValues(op, codeOK), duration: m.duration.WithLabelValues(op)})
		}
		s := v.(*okSeries)
		s.requests.Inc()
		s.duration.Observe(seconds)
		return
	}
	m.requests.WithLabelValues(op, string(code)).Inc()
	m.duration.WithLabelValues(op).Observe(seconds)
}
