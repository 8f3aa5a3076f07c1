package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUMeter is a driver that can ask its server (every node or member it
// talks to) how much CPU time it has used so far. A run reads it at the
// start and at the end of its measured time: CPU time per operation is
// steadier than throughput on a machine that other work shares, since it
// counts what the server spent, not how long it waited for a core.
type CPUMeter interface {
	ServerCPU(ctx context.Context) (time.Duration, error)
}

// processCPU is the CPU time, user and system, this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuWindow reads a meter's (and this process's) CPU time at the start of
// a measured time and again at its end.
type cpuWindow struct {
	meter              CPUMeter
	server0, client0   time.Duration
	serverOK, clientOK bool
	sched0             *metrics.Float64Histogram
}

// schedLatencies reads this process's histogram of goroutines' waits to
// run, nil if the runtime has none.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// histogramQuantile is the q quantile of the counts of h1 less those of
// h0 (the same buckets, read earlier): the upper bound of the bucket it
// falls in, in seconds; 0 when nothing was counted in between.
func histogramQuantile(h0, h1 *metrics.Float64Histogram, q float64) float64 {
	if h0 == nil || h1 == nil || len(h0.Counts) != len(h1.Counts) {
		return 0
	}
	var total uint64
	for i := range h1.Counts {
		total += h1.Counts[i] - h0.Counts[i]
	}
	if total == 0 {
		return 0
	}
	var seen uint64
	for i := range h1.Counts {
		seen += h1.Counts[i] - h0.Counts[i]
		if float64(seen) >= q*float64(total) {
			up := h1.Buckets[i+1]
			if math.IsInf(up, 1) {
				up = h1.Buckets[i]
			}
			return up
		}
	}
	return h1.Buckets[len(h1.Buckets)-1]
}

func (w *cpuWindow) start(ctx context.Context) {
	w.client0, w.clientOK = processCPU(), true
	w.sched0 = schedLatencies()
	if w.meter != nil {
		c, err := w.meter.ServerCPU(ctx)
		w.server0, w.serverOK = c, err == nil
	}
}

// finish sets res's CPU figures from the start to now.
func (w *cpuWindow) finish(ctx context.Context, res *Result) {
	if w.clientOK {
		res.ClientCPUSeconds = (processCPU() - w.client0).Seconds()
		res.ClientSchedP99Us = histogramQuantile(w.sched0, schedLatencies(), 0.99) * 1e6
	}
	if w.serverOK {
		if c, err := w.meter.ServerCPU(ctx); err == nil && c >= w.server0 {
			res.ServerCPUSeconds = (c - w.server0).Seconds()
		}
	}
}

// ServerCPUPerOp is the server's CPU time per successful operation of the
// measured time, in microseconds; 0 when unknown.
func (r Result) ServerCPUPerOp() float64 {
	if r.Ops == 0 {
		return 0
	}
	return r.ServerCPUSeconds * 1e6 / float64(r.Ops)
}

// ClientCPUPerOp is the benchmark process's CPU time per successful
// operation, in microseconds; 0 when unknown.
func (r Result) ClientCPUPerOp() float64 {
	if r.Ops == 0 {
		return 0
	}
	return r.ClientCPUSeconds * 1e6 / float64(r.Ops)
}

// errNoMeter: the driver does not know where its server reports its CPU
// time (a node in this process).
var errNoMeter = errors.New("bench: no server to ask for its CPU time")

// metricsURLs are the /metrics endpoints of groupkv nodes at addrs
// (host:port, serving HTTP and gRPC), over TLS when secure.
func metricsURLs(addrs []string, secure bool) []string {
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = scheme + a + "/metrics"
	}
	return out
}

// serverCPU sums the CPU time the servers of urls report; tlsCfg (nil:
// none) reaches those served over TLS.
func serverCPU(ctx context.Context, urls []string, tlsCfg *tls.Config) (time.Duration, error) {
	if len(urls) == 0 {
		return 0, errNoMeter
	}
	return metricsCPU(ctx, urls, tlsCfg)
}

// metricsCPU sums process_cpu_seconds_total of the Prometheus endpoints
// urls (groupkv's and etcd's /metrics).
func metricsCPU(ctx context.Context, urls []string, tlsCfg *tls.Config) (time.Duration, error) {
	client := metricsClient
	if tlsCfg != nil {
		client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg}}
	}
	var total float64
	for _, u := range urls {
		s, err := scrapeCPU(ctx, client, u)
		if err != nil {
			return 0, err
		}
		total += s
	}
	return time.Duration(total * float64(time.Second)), nil
}

// metricsClient scrapes with a connection per request: two per run, and a
// groupkv node's port, which also speaks gRPC over HTTP/2, is better not
// left with an idle HTTP/1.1 connection.
var metricsClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func scrapeCPU(ctx context.Context, client *http.Client, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseCPUMetric(resp.Body)
}

// parseCPUMetric reads process_cpu_seconds_total from Prometheus's text
// format.
func parseCPUMetric(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("bench: the metrics have no process_cpu_seconds_total")
}

// redisCPU reads used_cpu_sys and used_cpu_user from Redis's INFO cpu.
func parseRedisCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || k != "used_cpu_sys" && k != "used_cpu_user" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: INFO cpu: %s: %w", k, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, errors.New("bench: INFO cpu has no used_cpu_sys and used_cpu_user")
	}
	return time.Duration(total * float64(time.Second)), nil
}
