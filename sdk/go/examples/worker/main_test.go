package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bp "github.com/backpressure-dev/backpressure-operator/sdk/go"
)

// childEnv makes the test binary run the example's main instead of the tests, so the tests
// start the real program as a process and signal it.
const childEnv = "BP_EXAMPLE_WORKER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

func TestOptionsComeFromTheConformanceEnvironment(t *testing.T) {
	o, err := parseOptions(nil, env(map[string]string{
		"BP_WORKLOAD":           "orders",
		"BP_NAMESPACE":          "team-a",
		"BP_ADMIN_ADDR":         "127.0.0.1:0",
		"BP_ALLOWED_IDENTITIES": "system:serviceaccount:bp-system:backpressure-operator, system:serviceaccount:x:y,",
		"BP_CONFORMANCE_HOOK":   "true",
		"BP_KUBE_API_URL":       "https://127.0.0.1:6443",
		"BP_KUBE_CA_FILE":       "/tmp/ca.crt",
		"BP_KUBE_TOKEN_FILE":    "/tmp/token",
		"BP_DURATION":           "0",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		workload: "orders", namespace: "team-a", adminAddr: "127.0.0.1:0",
		allowed:         []string{"system:serviceaccount:bp-system:backpressure-operator", "system:serviceaccount:x:y"},
		conformanceHook: true, kubeAPIURL: "https://127.0.0.1:6443", kubeCAFile: "/tmp/ca.crt", kubeTokenFile: "/tmp/token",
		messages: 1000, work: 50 * time.Millisecond, seed: 1,
	}
	if o.workload != want.workload || o.namespace != want.namespace || o.adminAddr != want.adminAddr ||
		!slices.Equal(o.allowed, want.allowed) || o.conformanceHook != want.conformanceHook ||
		o.kubeAPIURL != want.kubeAPIURL || o.kubeCAFile != want.kubeCAFile || o.kubeTokenFile != want.kubeTokenFile ||
		o.duration != 0 || o.messages != want.messages || o.work != want.work || o.seed != want.seed {
		t.Fatalf("%+v\nwant %+v", o, want)
	}

	// No environment: the defaults, no pushes, no hook, run until a signal.
	o, err = parseOptions(nil, env(nil), io.Discard)
	if err != nil || o.workload != "example-worker" || o.adminAddr != "127.0.0.1:9464" || o.allowed != nil ||
		o.conformanceHook || o.duration != 0 {
		t.Fatalf("%+v %v", o, err)
	}

	// Flags of the same meaning win over the environment.
	o, err = parseOptions([]string{"-workload", "flagged", "-conformance-hook", "-duration", "90s", "-allowed-identity", "a,b"},
		env(map[string]string{"BP_WORKLOAD": "orders", "BP_CONFORMANCE_HOOK": "0", "BP_DURATION": "5"}), io.Discard)
	if err != nil || o.workload != "flagged" || !o.conformanceHook || o.duration != 90*time.Second || !slices.Equal(o.allowed, []string{"a", "b"}) {
		t.Fatalf("%+v %v", o, err)
	}
	for value, on := range map[string]bool{"1": true, "true": true, "TRUE": true, "0": false, "false": false} {
		o, err := parseOptions(nil, env(map[string]string{"BP_CONFORMANCE_HOOK": value}), io.Discard)
		if err != nil || o.conformanceHook != on {
			t.Fatalf("BP_CONFORMANCE_HOOK=%s: %v %v", value, o.conformanceHook, err)
		}
	}
	if o, err := parseOptions(nil, env(map[string]string{"BP_DURATION": "30"}), io.Discard); err != nil || o.duration != 30*time.Second {
		t.Fatalf("BP_DURATION=30: %v %v", o.duration, err)
	}

	// Refused, naming what is wrong.
	for name, vars := range map[string]map[string]string{
		"BP_CONFORMANCE_HOOK": {"BP_CONFORMANCE_HOOK": "yes"},
		"BP_DURATION":         {"BP_DURATION": "soon"},
		"BP_MESSAGES":         {"BP_MESSAGES": "-3"},
		"BP_KUBE_API_URL":     {"BP_KUBE_CA_FILE": "/tmp/ca.crt"},
		"BP_KUBE_TOKEN_FILE":  {"BP_KUBE_API_URL": "https://127.0.0.1:6443"},
	} {
		if _, err := parseOptions(nil, env(vars), io.Discard); err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%v: %v", vars, err)
		}
	}
	if _, err := parseOptions([]string{"extra"}, env(nil), io.Discard); err == nil {
		t.Fatal("a stray argument is accepted")
	}
	// With an explicit API server, the namespace of the audience must be given.
	if _, err := verifier(options{workload: "w", kubeAPIURL: "https://127.0.0.1:6443", kubeTokenFile: "/tmp/token"}); err == nil ||
		!strings.Contains(err.Error(), "BP_NAMESPACE") {
		t.Fatal(err)
	}
	v, err := verifier(options{workload: "orders", namespace: "team-a", kubeAPIURL: "https://127.0.0.1:6443", kubeTokenFile: "/tmp/token"})
	if err != nil || v.Audience() != bp.PushAudience("team-a", "orders") {
		t.Fatal(v, err)
	}
}

// syncBuffer collects a child's stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listening = regexp.MustCompile(`admin server listening addr=(\S+)`)

// startWorker starts the example as a process with only vars in its environment (and PATH),
// as a conformance harness does, and waits for its admin address.
func startWorker(t *testing.T, vars map[string]string) (*exec.Cmd, string, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{childEnv + "=1", "PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			return cmd, m[1], stderr
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the worker did not start listening:\n%s", stderr)
	return nil, "", nil
}

// stopWith sends sig and expects a clean exit within a few seconds.
func stopWith(t *testing.T, cmd *exec.Cmd, sig syscall.Signal, stderr *syncBuffer) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after %v: %v\n%s", sig, err, stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after %v\n%s", sig, stderr)
	}
	if !strings.Contains(stderr.String(), "stopped") {
		t.Fatalf("no stop report:\n%s", stderr)
	}
}

func TestWorkerServesTheHookUntilSIGTERM(t *testing.T) {
	cmd, addr, stderr := startWorker(t, map[string]string{
		"BP_WORKLOAD":         "orders",
		"BP_NAMESPACE":        "team-a",
		"BP_ADMIN_ADDR":       "127.0.0.1:0",
		"BP_CONFORMANCE_HOOK": "1",
		"BP_DURATION":         "0",
	})
	base := "http://" + addr
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatal(code)
	}
	// A case: a fresh controller starts at 2 permits.
	cfg, _ := json.Marshal(bp.DefaultWorkerConfig())
	body := `{"seed": 7, "brakeOffsetNs": 0, "config": ` + string(cfg) + `, "steps": [
		{"t": 1000000000, "op": "permits", "inFlight": 0},
		{"t": 1000000000, "op": "record", "outcome": "dependency_failure"}]}`
	resp, err := http.Post(base+bp.ConformanceHookPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var out bp.Observations
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(out.Observations) != 2 ||
		out.Observations[0].Permits == nil || *out.Observations[0].Permits != 2 || out.Observations[1].Permits != nil {
		t.Fatalf("%d %+v %v", resp.StatusCode, out, err)
	}
	code, metrics := get("/metrics")
	if code != http.StatusOK || !strings.Contains(metrics, `backpressure_config_info{algorithm="SetPoint",hash=`) ||
		!strings.Contains(metrics, `workload="orders"`) {
		t.Fatalf("%d\n%s", code, metrics)
	}
	// No allowed identities: pushes are refused.
	req, _ := http.NewRequest(http.MethodPut, base+bp.ConfigPath, strings.NewReader(string(cfg)))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatal(resp.StatusCode)
	}
	stopWith(t, cmd, syscall.SIGTERM, stderr)
}

func TestWithoutTheHookThePathIsNotFoundAndSIGINTStops(t *testing.T) {
	cmd, addr, stderr := startWorker(t, map[string]string{"BP_ADMIN_ADDR": "127.0.0.1:0"})
	resp, err := http.Post("http://"+addr+bp.ConformanceHookPath, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatal(resp.StatusCode)
	}
	stopWith(t, cmd, syscall.SIGINT, stderr)
}

func TestABadEnvironmentExitsWithTheReason(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{childEnv + "=1", "BP_CONFORMANCE_HOOK=maybe"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "BP_CONFORMANCE_HOOK") {
		t.Fatalf("%v\n%s", err, out)
	}
}
