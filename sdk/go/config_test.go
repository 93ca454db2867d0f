package backpressure

// Ports of the Rust worker's config tests (crates/worker/src/config/tests.rs): the config
// state, the file watcher and the admin endpoint with an injected token verifier.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newState(t *testing.T) (*ConfigState, *Gate, *Metrics) {
	t.Helper()
	m := NewMetrics("w")
	g := NewGate(Build(steadySettings(), 1), WithMetrics(m))
	return NewConfigState(g, DefaultWorkerConfig(), m), g, m
}

func config(generation int64, maxPermits uint32) WorkerConfig {
	c := DefaultWorkerConfig()
	c.Generation = generation
	c.MaxPermits = maxPermits
	return c.WithHash()
}

func TestApplyUpdatesGateAndMetricsAndRefusesStaleOrInvalid(t *testing.T) {
	state, gate, metrics := newState(t)
	if state.Ack().Hash != DefaultWorkerConfig().Hash {
		t.Fatal(state.Ack())
	}
	ack, err := state.Apply(config(3, 4), OriginPush)
	if err != nil || ack.Generation != 3 || gate.Snapshot().Limit != 4 {
		t.Fatal(err, ack)
	}
	var info []string
	for _, l := range strings.Split(metrics.Encode(), "\n") {
		if strings.HasPrefix(l, "backpressure_config_info{") {
			info = append(info, l)
		}
	}
	if len(info) != 1 || !strings.Contains(info[0], `hash="`+ack.Hash+`"`) ||
		!strings.Contains(info[0], `algorithm="SetPoint"`) || !strings.HasSuffix(info[0], " 1") {
		t.Fatal(info)
	}
	var stale *StaleError
	if _, err := state.Apply(config(2, 8), OriginPush); !errors.As(err, &stale) || stale.Running != 3 || stale.Given != 2 {
		t.Fatal(err)
	}
	if gate.Snapshot().Limit != 4 {
		t.Fatal("a stale push changed the gate")
	}
	bad := DefaultWorkerConfig()
	bad.SetPoint, bad.Generation = 2, 9
	if _, err := state.Apply(bad, OriginPush); fieldOf(err) != "setPoint" && !errors.As(err, new(*HashError)) {
		t.Fatal(err)
	}
	if _, err := state.ApplyBytes([]byte("{"), OriginPush); err == nil {
		t.Fatal("malformed accepted")
	}
	if state.Ack() != ack || state.Origin() != OriginPush {
		t.Fatal(state.Ack())
	}
	if again, err := state.Apply(config(3, 4), OriginFile); err != nil || again != ack || state.Origin() != OriginPush {
		t.Fatal("the same payload again changed something")
	}
	braked := DefaultWorkerConfig()
	braked.Generation, braked.Algorithm, braked.Hash = 4, AlgorithmFixed, ""
	braked.Brake = &BrakeConfig{MinBackoff: 0.5}
	ack, err = state.Apply(braked, OriginPush)
	if err != nil || len(ack.Hash) != 12 {
		t.Fatal(err, ack)
	}
	if gate.Settings().Algorithm != AlgorithmFixed || gate.Snapshot().Limit != 8 || gate.Snapshot().Backoff != 0.5 {
		t.Fatal(gate.Snapshot())
	}
}

func TestLibraryKnobsSurviveAPush(t *testing.T) {
	s := steadySettings()
	s.Credit, s.HealthCheckProbes = 0.25, true
	g := NewGate(Build(s, 1))
	state := NewConfigState(g, DefaultWorkerConfig(), nil)
	if _, err := state.Apply(config(1, 5), OriginPush); err != nil {
		t.Fatal(err)
	}
	got := g.Settings()
	if got.MaxPermits != 5 || got.Credit != 0.25 || !got.HealthCheckProbes {
		t.Fatalf("%+v", got)
	}
}

func TestOptionalSettingsOfAPayloadAreAppliedAndAbsentOnesKeepTheApplications(t *testing.T) {
	state, gate, _ := newState(t)
	before := gate.Settings()
	if before.InitialPermits != 0 || !before.HasRedelivery {
		t.Fatalf("%+v", before)
	}
	c := config(2, 8)
	c.InitialPermits, c.RatioWindowMs, c.BrakeReleaseMs, c.FloorMax = ptr(uint32(4)), ptr(uint64(10_000)), ptr(uint64(0)), ptr(0.1)
	c.Redelivery = &RedeliveryConfig{BaseMs: 30_000, MaxMs: 120_000}
	if _, err := state.Apply(c.WithHash(), OriginPush); err != nil {
		t.Fatal(err)
	}
	s := gate.Settings()
	if s.InitialPermits != 4 || s.RatioWindow != NanosFromSecs(10) || s.BrakeRelease != 0 || s.FloorMax != 0.1 ||
		s.RedeliveryBase != NanosFromSecs(30) || s.RedeliveryMax != NanosFromSecs(120) {
		t.Fatalf("%+v", s)
	}
	c = config(3, 8)
	c.Redelivery = &RedeliveryConfig{}
	if _, err := state.Apply(c.WithHash(), OriginPush); err != nil || gate.Settings().HasRedelivery {
		t.Fatal("baseMs 0 turns the redelivery backoff off")
	}
	if _, err := state.Apply(config(4, 8), OriginPush); err != nil {
		t.Fatal(err)
	}
	s = gate.Settings()
	if s.InitialPermits != before.InitialPermits || s.RatioWindow != before.RatioWindow || s.BrakeRelease != before.BrakeRelease ||
		s.FloorMax != before.FloorMax || s.HasRedelivery != before.HasRedelivery || s.RedeliveryBase != before.RedeliveryBase {
		t.Fatalf("%+v vs %+v", s, before)
	}
}

func TestGenerationsFarAheadOfTheClockAreRefusedWithoutEffect(t *testing.T) {
	const now = int64(1_700_000_000)
	state, gate, _ := newState(t)
	ahead := func(g int64) WorkerConfig {
		c := DefaultWorkerConfig()
		c.Generation, c.MaxPermits, c.Hash = g, 3, ""
		c.Brake = &BrakeConfig{MinBackoff: 1}
		return c
	}
	for _, g := range []int64{1<<63 - 1, now*1000 + MaxGenerationLeadMs + 1, now * 1_000_000} {
		_, err := state.ApplyAt(ahead(g), OriginPush, now)
		if fieldOf(err) != "generation" || !strings.Contains(err.Error(), "ahead of this worker's clock") {
			t.Fatal(err)
		}
		if state.Ack().Generation != 0 || gate.Snapshot().Limit != 16 || gate.Snapshot().Backoff != 0 {
			t.Fatal("refused push changed the config")
		}
	}
	ack, err := state.ApplyAt(ahead(now*1000+MaxGenerationLeadMs), OriginPush, now)
	if err != nil || ack.Generation != now*1000+MaxGenerationLeadMs || gate.Snapshot().Backoff != 1 {
		t.Fatal(err)
	}
}

func TestValuesOverTheWorkerLimitsAreRefusedNamingTheField(t *testing.T) {
	state, gate, _ := newState(t)
	limits := DefaultLimits()
	cases := []struct {
		field string
		mut   func(*WorkerConfig)
	}{
		{"maxPermits", func(c *WorkerConfig) { c.MaxPermits = limits.MaxPermits + 1 }},
		{"maxPermits", func(c *WorkerConfig) { c.MaxPermits = 1<<32 - 1 }},
		{"reaction", func(c *WorkerConfig) { c.Reaction = limits.MaxReaction + 1 }},
		{"probeInitialMs", func(c *WorkerConfig) { c.ProbeInitialMs = 1 }},
		{"probeMaxMs", func(c *WorkerConfig) { c.ProbeMaxMs = limits.MaxProbeMs + 1 }},
		{"probeInitialMs", func(c *WorkerConfig) { c.ProbeInitialMs, c.ProbeMaxMs = 1<<63-1, 1<<64-1 }},
		{"initialPermits", func(c *WorkerConfig) { c.InitialPermits = ptr(uint32(1025)) }},
		{"ratioWindowMs", func(c *WorkerConfig) { c.RatioWindowMs = ptr(uint64(3_600_001)) }},
		{"brakeReleaseMs", func(c *WorkerConfig) { c.BrakeReleaseMs = ptr(uint64(3_600_001)) }},
		{"redelivery.maxMs", func(c *WorkerConfig) { c.Redelivery = &RedeliveryConfig{BaseMs: 1, MaxMs: 43_200_001} }},
		{"floorMax", func(c *WorkerConfig) { c.FloorMax = ptr(0.91) }},
	}
	running := state.Ack()
	for _, tc := range cases {
		c := config(1, 1)
		tc.mut(&c)
		c.Hash = ""
		_, err := state.Apply(c, OriginPush)
		if fieldOf(err) != tc.field {
			t.Errorf("%s: %v", tc.field, err)
		}
		if state.Ack() != running || gate.Snapshot().Limit != 16 {
			t.Fatal("refused push changed the config")
		}
	}
	big := config(2, 5000)
	if _, err := state.Apply(big, OriginFile); err == nil {
		t.Fatal("the file path is held to the limits too")
	}
	l := DefaultLimits()
	l.MaxPermits = 5000
	state.SetLimits(l)
	if _, err := state.Apply(big, OriginPush); err != nil || gate.Snapshot().Limit != 5000 {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, state *ConfigState, generation int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for state.Ack().Generation != generation {
		if time.Now().After(deadline) {
			t.Fatalf("generation %d not applied: %+v", generation, state.Ack())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func watch(t *testing.T, state *ConfigState, path string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { NewFileWatcher(state, path).Run(ctx, 20*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestFileRewrittenInPlaceIsHotReloaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), ConfigFileName)
	state, gate, _ := newState(t)
	watch(t, state, path)
	time.Sleep(60 * time.Millisecond)
	if state.Origin() != OriginInitial {
		t.Fatal("applied without a file")
	}
	write := func(data []byte) {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(mustJSON(t, config(1, 3)))
	waitFor(t, state, 1)
	if gate.Snapshot().Limit != 3 || state.Origin() != OriginFile {
		t.Fatal("file not applied")
	}
	write(mustJSON(t, config(2, 6)))
	waitFor(t, state, 2)
	write([]byte(`{"version": "nope"}`))
	time.Sleep(150 * time.Millisecond)
	if state.Ack().Generation != 2 || gate.Snapshot().Limit != 6 {
		t.Fatal("an invalid file changed the config")
	}
	write(mustJSON(t, config(3, 7)))
	waitFor(t, state, 3)
	if gate.Snapshot().Limit != 7 {
		t.Fatal(gate.Snapshot())
	}
}

// kubeletUpdate writes the file the way kubelet updates a ConfigMap volume: a new
// timestamped directory, a ..data_tmp symlink to it renamed over ..data, the old one removed.
func kubeletUpdate(t *testing.T, dir, stamp string, data []byte) {
	t.Helper()
	ts := filepath.Join(dir, stamp)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(ts, 0o755))
	must(os.WriteFile(filepath.Join(ts, ConfigFileName), data, 0o644))
	old, oldErr := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	must(os.Symlink(stamp, tmp))
	must(os.Rename(tmp, filepath.Join(dir, "..data")))
	link := filepath.Join(dir, ConfigFileName)
	if _, err := os.Lstat(link); err != nil {
		must(os.Symlink("..data/"+ConfigFileName, link))
	}
	if oldErr == nil {
		must(os.RemoveAll(filepath.Join(dir, old)))
	}
}

func TestConfigMapSymlinkSwapIsHotReloaded(t *testing.T) {
	dir := t.TempDir()
	kubeletUpdate(t, dir, "..2024_01_01_00_00_00.000000001", mustJSON(t, config(1, 2)))
	state, gate, _ := newState(t)
	watch(t, state, filepath.Join(dir, ConfigFileName))
	waitFor(t, state, 1)
	if gate.Snapshot().Limit != 2 {
		t.Fatal(gate.Snapshot())
	}
	kubeletUpdate(t, dir, "..2024_01_01_00_01_00.000000002", mustJSON(t, config(2, 9)))
	waitFor(t, state, 2)
	kubeletUpdate(t, dir, "..2024_01_01_00_02_00.000000003", mustJSON(t, config(5, 1)))
	waitFor(t, state, 5)
	if gate.Snapshot().Limit != 1 {
		t.Fatal(gate.Snapshot())
	}
}

// staticTokens is a verifier with a fixed token table, for the status-code mapping (the real
// TokenReview is tested against a real API server by the integration tests).
type staticTokens map[string]string

func (s staticTokens) Verify(_ context.Context, token string) (Identity, error) {
	switch user, ok := s[token]; {
	case !ok:
		return Identity{}, &UnauthenticatedError{"unknown token"}
	case user == "":
		return Identity{}, &UnavailableError{"down"}
	default:
		return Identity{Username: user}, nil
	}
}

const operator = "system:serviceaccount:bp-system:backpressure-operator"

func newAdmin(t *testing.T) (*Admin, *Gate) {
	t.Helper()
	state, gate, metrics := newState(t)
	tokens := staticTokens{"good": operator, "other": "system:serviceaccount:bp-system:someone-else", "down": ""}
	a := NewAdmin(state, metrics).WithVerifier(tokens, operator).WithTimeouts(300*time.Millisecond, 300*time.Millisecond)
	return a, gate
}

func call(a *Admin, method, path, token string, body []byte) (int, string) {
	return callFrom(a, "192.0.2.1:1234", method, path, token, body)
}

func callFrom(a *Admin, peer, method, path, token string, body []byte) (int, string) {
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	r.RemoteAddr = peer
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if ra := w.Header().Get("Retry-After"); ra != "" {
		return w.Code, "retry-after=" + ra
	}
	return w.Code, w.Body.String()
}

func TestPushStatusCodesAndRefusalsLeaveConfigUnchanged(t *testing.T) {
	a, gate := newAdmin(t)
	running := a.State().Ack()
	good := mustJSON(t, config(7, 3))
	zero := DefaultWorkerConfig()
	zero.Reaction, zero.Generation = 0, 8
	cases := []struct {
		token string
		body  []byte
		want  int
	}{
		{"", good, 401},
		{"forged", good, 401},
		{"other", good, 403},
		{"down", good, 503},
		{"good", []byte("{not json"), 400},
		{"good", mustJSON(t, zero), 400},
		{"good", bytes.Repeat([]byte(" "), MaxPayloadBytes+1), 413},
	}
	for _, c := range cases {
		status, text := call(a, "PUT", ConfigPath, c.token, c.body)
		if status != c.want || !strings.Contains(text, `"error"`) {
			t.Errorf("%q: %d %s", c.token, status, text)
		}
		if a.State().Ack() != running || gate.Snapshot().Limit != 16 {
			t.Fatal("refused push changed the config")
		}
	}
	status, text := call(a, "PUT", ConfigPath, "good", good)
	var ack ConfigAck
	if status != 200 || json.Unmarshal([]byte(text), &ack) != nil || ack.Generation != 7 || gate.Snapshot().Limit != 3 {
		t.Fatal(status, text)
	}
	if status, text := call(a, "PUT", ConfigPath, "good", mustJSON(t, config(6, 9))); status != 409 {
		t.Fatal(status, text)
	}
	status, text = call(a, "GET", ConfigPath, "", nil)
	var got ConfigAck
	if status != 200 || json.Unmarshal([]byte(text), &got) != nil || got != ack {
		t.Fatal(status, text)
	}
	if status, text := call(a, "GET", MetricsPath, "", nil); status != 200 || !strings.Contains(text, ack.Hash) {
		t.Fatal(status, text)
	}
	for _, c := range []struct {
		method, path string
		want         int
	}{{"GET", HealthzPath, 200}, {"GET", "/nope", 404}, {"POST", ConfigPath, 405}, {"PUT", HealthzPath, 405}} {
		if status, _ := call(a, c.method, c.path, "", nil); status != c.want {
			t.Errorf("%s %s: %d", c.method, c.path, status)
		}
	}
}

func TestPushesAreRefusedWithoutAVerifier(t *testing.T) {
	state, _, _ := newState(t)
	a := NewAdmin(state, nil)
	if status, _ := call(a, "PUT", ConfigPath, "anything", mustJSON(t, config(1, 2))); status != 401 || state.Ack().Generation != 0 {
		t.Fatal(status)
	}
	if status, _ := call(a, "GET", MetricsPath, "", nil); status != 404 {
		t.Fatal(status)
	}
}

func TestFailedAuthenticationsAreRateLimitedPerSource(t *testing.T) {
	state, gate, _ := newState(t)
	clock := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	a := NewAdmin(state, nil).
		WithVerifier(staticTokens{"good": operator, "other": "system:serviceaccount:bp-system:someone-else"}, operator).
		WithFailureLimit(FailureLimit{Burst: 3, Refill: 2 * time.Second})
	a.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	body := func(g int64) []byte { return mustJSON(t, config(g, 2)) }
	attacker := "10.0.0.66:40000"
	for _, c := range []struct {
		token string
		want  int
	}{{"", 401}, {"forged", 401}, {"other", 403}} {
		if status, _ := callFrom(a, attacker, "PUT", ConfigPath, c.token, body(1)); status != c.want {
			t.Fatal(c.token, status)
		}
	}
	for _, token := range []string{"forged", "", "good"} {
		if status, text := callFrom(a, attacker, "PUT", ConfigPath, token, body(1)); status != 429 || text != "retry-after=2" {
			t.Fatal(token, status, text)
		}
	}
	if state.Ack().Generation != 0 {
		t.Fatal("throttled push applied")
	}
	if status, _ := callFrom(a, "10.0.0.66:40001", "PUT", ConfigPath, "good", body(1)); status != 429 {
		t.Fatal("another port of the same address is the same source")
	}
	op := "10.0.0.7:50000"
	for g := int64(2); g < 20; g++ {
		if status, _ := callFrom(a, op, "PUT", ConfigPath, "good", body(g)); status != 200 {
			t.Fatal(g, status)
		}
	}
	if gate.Snapshot().Limit != 2 {
		t.Fatal(gate.Snapshot())
	}
	advance(2 * time.Second)
	if status, _ := callFrom(a, attacker, "PUT", ConfigPath, "forged", body(1)); status != 401 {
		t.Fatal("one failure forgiven per refill period")
	}
	if status, _ := callFrom(a, attacker, "PUT", ConfigPath, "forged", body(1)); status != 429 {
		t.Fatal(status)
	}
	advance(2 * time.Second)
	if status, _ := callFrom(a, attacker, "PUT", ConfigPath, "good", body(30)); status != 200 || state.Ack().Generation != 30 {
		t.Fatal(status)
	}
}

// raw sends a raw HTTP request to addr and reads the answer until the server closes.
func raw(t *testing.T, addr, request string) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(bufio.NewReader(conn))
	return string(out)
}

func TestServerOverTCPWithLimitsAndTimeouts(t *testing.T) {
	a, gate := newAdmin(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- a.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	addr := l.Addr().String()
	body := string(mustJSON(t, config(2, 5)))
	put := "PUT " + ConfigPath + " HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nConnection: close\r\n"
	if ok := raw(t, addr, fmt.Sprintf("%sContent-Length: %d\r\n\r\n%s", put, len(body), body)); !strings.HasPrefix(ok, "HTTP/1.1 200") {
		t.Fatal(ok)
	}
	if gate.Snapshot().Limit != 5 {
		t.Fatal(gate.Snapshot())
	}
	if big := raw(t, addr, fmt.Sprintf("%sContent-Length: %d\r\n\r\n", put, MaxPayloadBytes+1)); !strings.HasPrefix(big, "HTTP/1.1 413") {
		t.Fatal(big)
	}
	if slow := raw(t, addr, put+"Content-Length: 100\r\n\r\n{"); !strings.HasPrefix(slow, "HTTP/1.1 408") {
		t.Fatal(slow)
	}
	// A client that never finishes its headers is disconnected.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: w\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatal("connection with unfinished headers was not closed:", err)
	}
	conn.Close()
	if a.State().Ack().Generation != 2 {
		t.Fatal(a.State().Ack())
	}
	metrics := raw(t, addr, "GET /metrics HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(metrics, "HTTP/1.1 200") || !strings.Contains(metrics, `backpressure_permits{workload="w"} 5`) {
		t.Fatal(metrics)
	}
}

func TestMetricsExpositionUsesTheWireNamesAndLabels(t *testing.T) {
	m := NewMetrics("export-worker")
	m.SetBackoff(0.5)
	m.SetPermits(8)
	m.SetInFlight(3)
	m.RecordOutcome(Success)
	m.RecordOutcome(Success)
	m.RecordOutcome(DependencyFailure)
	m.RecordProbe()
	m.SetFailureFloor(0, false)
	m.SetConfig("abc123def456", AlgorithmSetPoint)
	m.SetConfig("0123456789ab", AlgorithmRatioThrottle)
	type sample struct {
		labels map[string]string
		value  string
	}
	samples := map[string][]sample{}
	for _, line := range strings.Split(m.Encode(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series, value, _ := strings.Cut(line, " ")
		name, rest, _ := strings.Cut(series, "{")
		labels := map[string]string{}
		for _, pair := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		samples[name] = append(samples[name], sample{labels, value})
	}
	want := []string{MetricBackoff, MetricFailureFloor, MetricPermits, MetricInFlight, MetricOutcomesTotal, MetricProbesTotal, MetricConfigInfo}
	if len(samples) != len(want) {
		t.Fatalf("%v", samples)
	}
	for _, name := range want {
		for _, s := range samples[name] {
			if s.labels[LabelWorkload] != "export-worker" {
				t.Fatalf("%s lacks the workload label", name)
			}
		}
	}
	one := func(name, value string) {
		if len(samples[name]) != 1 || samples[name][0].value != value {
			t.Errorf("%s: %v, want %s", name, samples[name], value)
		}
	}
	one(MetricBackoff, "0.5")
	one(MetricPermits, "8")
	one(MetricInFlight, "3")
	one(MetricProbesTotal, "1")
	one(MetricFailureFloor, "NaN")
	counts := map[string]string{}
	for _, s := range samples[MetricOutcomesTotal] {
		if len(s.labels) != 2 {
			t.Fatalf("%v", s.labels)
		}
		counts[s.labels[LabelClass]] = s.value
	}
	if counts[ClassSuccess] != "2" || counts[ClassDependencyFailure] != "1" || counts[ClassMessageFailure] != "0" {
		t.Fatal(counts)
	}
	info := samples[MetricConfigInfo]
	if len(info) != 1 || info[0].labels[LabelHash] != "0123456789ab" || info[0].labels[LabelAlgorithm] != "RatioThrottle" || info[0].value != "1" {
		t.Fatal(info)
	}
	// OpenMetrics when the scraper asks for it, as Prometheus does.
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.Header.Set("Accept", "application/openmetrics-text;version=1.0.0")
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, r)
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/openmetrics-text") ||
		!strings.Contains(w.Body.String(), "# TYPE backpressure_outcomes counter") || !strings.HasSuffix(w.Body.String(), "# EOF\n") {
		t.Fatal(w.Header(), w.Body.String())
	}
}
