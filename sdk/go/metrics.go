package backpressure

import (
	"bytes"
	"math"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metrics are the worker's metrics of the wire contract (the Rust worker's metrics::Metrics),
// every series labelled workload, in a registry of their own. Safe for concurrent use.
type Metrics struct {
	registry     *prometheus.Registry
	registerer   prometheus.Registerer
	backoff      prometheus.Gauge
	failureFloor prometheus.Gauge
	permits      prometheus.Gauge
	inFlight     prometheus.Gauge
	outcomes     [3]prometheus.Counter
	probes       prometheus.Counter
	configInfo   *prometheus.GaugeVec
	configMu     sync.Mutex
}

// NewMetrics creates the metrics of workload (the `workload` label of every series, the
// WorkerBackpressure's spec.metrics.workload).
func NewMetrics(workload string) *Metrics {
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{LabelWorkload: workload}, reg)
	m := &Metrics{
		registry:   reg,
		registerer: wrapped,
		backoff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricBackoff,
			Help: "Backoff factor of the worker's backpressure controller, in [0,1]",
		}),
		failureFloor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricFailureFloor,
			Help: "Share of dependency calls the worker found to fail whatever its concurrency, in [0,1]",
		}),
		permits: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricPermits,
			Help: "Messages the worker may process at once right now",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricInFlight,
			Help: "Messages being processed",
		}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricProbesTotal,
			Help: "Probes sent while fully backed off",
		}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricConfigInfo,
			Help: "The running worker configuration (value 1)",
		}, []string{LabelHash, LabelAlgorithm}),
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricOutcomesTotal,
		Help: "Message outcomes by class",
	}, []string{LabelClass})
	for _, o := range Outcomes {
		// Every class series exists from the start.
		m.outcomes[o] = outcomes.WithLabelValues(o.Class())
	}
	wrapped.MustRegister(m.backoff, m.failureFloor, m.permits, m.inFlight, outcomes, m.probes, m.configInfo)
	return m
}

// Registerer registers further metrics of the application in the same registry; they get
// the workload label too.
func (m *Metrics) Registerer() prometheus.Registerer { return m.registerer }

// Gatherer is the registry (to expose it elsewhere).
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.registry }

// Handler serves the registry (OpenMetrics when the scraper asks for it, as Prometheus does).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// SetBackoff sets the backoff gauge.
func (m *Metrics) SetBackoff(b float64) { m.backoff.Set(b) }

// SetFailureFloor sets the failure-floor gauge: NaN while the controller does not know it.
func (m *Metrics) SetFailureFloor(floor float64, known bool) {
	if !known {
		floor = math.NaN()
	}
	m.failureFloor.Set(floor)
}

// SetPermits sets the permits gauge.
func (m *Metrics) SetPermits(p uint32) { m.permits.Set(float64(p)) }

// SetInFlight sets the in-flight gauge.
func (m *Metrics) SetInFlight(n uint32) { m.inFlight.Set(float64(n)) }

// RecordOutcome counts one outcome.
func (m *Metrics) RecordOutcome(o Outcome) { m.outcomes[o].Inc() }

// RecordProbe counts one probe.
func (m *Metrics) RecordProbe() { m.probes.Inc() }

// SetConfig replaces the config info series with the running hash and algorithm.
func (m *Metrics) SetConfig(hash string, algorithm Algorithm) {
	m.configMu.Lock()
	defer m.configMu.Unlock()
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(hash, string(algorithm)).Set(1)
}

// OutcomeCount is the count of one class so far.
func (m *Metrics) OutcomeCount(o Outcome) uint64 { return counterValue(m.outcomes[o]) }

// ProbeCount is the probes counted so far.
func (m *Metrics) ProbeCount() uint64 { return counterValue(m.probes) }

func counterValue(c prometheus.Counter) uint64 {
	var out dto.Metric
	if err := c.Write(&out); err != nil || out.Counter == nil {
		return 0
	}
	return uint64(out.Counter.GetValue())
}

// Encode is the Prometheus text exposition of the registry.
func (m *Metrics) Encode() string {
	families, err := m.registry.Gather()
	if err != nil {
		return ""
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			return buf.String()
		}
	}
	return buf.String()
}
