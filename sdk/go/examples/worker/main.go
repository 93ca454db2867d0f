// Command worker is an example queue worker built on the Go SDK: an in-memory queue, a
// simulated dependency with an optional outage and capacity limit, the permit gate, the admin
// server (/metrics, /healthz, GET and PUT /v1/config, and the conformance hook when asked
// for) and an optional hot-reloaded config file. It runs until SIGTERM or SIGINT (or for
// -duration), and exits 0 when stopped by a signal.
//
//	go run ./examples/worker -messages 5000 -outage-at 5s -outage-for 20s
//	curl -s 127.0.0.1:9464/metrics
//
// Every setting is a flag and an environment variable (the environment of
// conformance/README.md, "Starting a worker for a conformance run"; a flag wins):
//
//	BP_WORKLOAD            -workload          the workload label and the token audience's workload
//	BP_NAMESPACE           -namespace         the pod's namespace (default: the in-cluster ServiceAccount's)
//	BP_ADMIN_ADDR          -admin-addr        host:port of the admin server (default 127.0.0.1:9464)
//	BP_ALLOWED_IDENTITIES  -allowed-identity  comma-separated usernames allowed to push; enables pushes
//	BP_CONFORMANCE_HOOK    -conformance-hook  true or 1: serve POST /v1/conformance/controller
//	BP_KUBE_API_URL        -kube-api-url      the API server for TokenReview (default: in-cluster)
//	BP_KUBE_CA_FILE        -kube-ca-file      its CA bundle (PEM)
//	BP_KUBE_TOKEN_FILE     -kube-token-file   the bearer token to call it with
//	BP_CONFIG_FILE         -config-file       a mounted worker-config.json to watch
//	BP_DURATION            -duration          stop after this long (seconds or a Go duration; 0: run until a signal)
//	BP_MESSAGES, BP_CAPACITY, BP_SEED         -messages, -capacity, -seed
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bp "github.com/backpressure-dev/backpressure-operator/sdk/go"
)

// options are the example's settings.
type options struct {
	workload        string
	namespace       string
	adminAddr       string
	allowed         []string
	conformanceHook bool
	kubeAPIURL      string
	kubeCAFile      string
	kubeTokenFile   string
	configFile      string
	duration        time.Duration
	messages        int
	work            time.Duration
	capacity        int64
	outageAt        time.Duration
	outageFor       time.Duration
	seed            uint64
}

// envValue is a flag whose default comes from an environment variable, parsed by the same
// function as the flag (so a bad value in either is an error that names it).
type envValue[T any] struct {
	target *T
	parse  func(string) (T, error)
	show   func(T) string
}

func (v envValue[T]) String() string {
	if v.target == nil {
		return ""
	}
	return v.show(*v.target)
}

func (v envValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.target = x
	return nil
}

// boolFlag lets -conformance-hook stand alone (as a Go bool flag).
type boolValue struct{ envValue[bool] }

func (boolValue) IsBoolFlag() bool { return true }

// parseBool takes true/1 and false/0 (and the empty string as false).
func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1":
		return true, nil
	case "false", "0", "":
		return false, nil
	}
	return false, fmt.Errorf("%q is not true, 1, false or 0", s)
}

// parseSeconds takes whole seconds ("30", as the Rust example's BP_DURATION) or a Go
// duration ("90s", "5m").
func parseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is neither seconds nor a duration", s)
	}
	return d, nil
}

// identities splits a comma-separated list, dropping blanks.
func identities(s string) ([]string, error) {
	var out []string
	for _, id := range strings.Split(s, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out, nil
}

func str(s string) (string, error) { return s, nil }

// parseOptions reads the flags in args over the environment getenv.
func parseOptions(args []string, getenv func(string) string, output io.Writer) (options, error) {
	o := options{
		workload:  "example-worker",
		adminAddr: "127.0.0.1:9464",
		messages:  1000,
		work:      50 * time.Millisecond,
		seed:      1,
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(output)
	showStr := func(s string) string { return s }
	showList := func(l []string) string { return strings.Join(l, ",") }
	showBool := strconv.FormatBool
	showDur := func(d time.Duration) string { return d.String() }
	type setting struct {
		flag, env, usage string
		value            flag.Value
	}
	settings := []setting{
		{"workload", "BP_WORKLOAD", "workload name (the workload label of every metric)", envValue[string]{&o.workload, str, showStr}},
		{"namespace", "BP_NAMESPACE", "the pod's namespace: the token audience is backpressure.dev/<namespace>/<workload> (default: the in-cluster ServiceAccount's)", envValue[string]{&o.namespace, str, showStr}},
		{"admin-addr", "BP_ADMIN_ADDR", "admin server address, host:port", envValue[string]{&o.adminAddr, str, showStr}},
		{"allowed-identity", "BP_ALLOWED_IDENTITIES", "comma-separated usernames allowed to push configuration (e.g. system:serviceaccount:bp-system:backpressure-operator); enables pushes, checked with a TokenReview", envValue[[]string]{&o.allowed, identities, showList}},
		{"conformance-hook", "BP_CONFORMANCE_HOOK", "serve the conformance hook POST " + bp.ConformanceHookPath + " (true or 1; conformance runs only, never in production)", boolValue{envValue[bool]{&o.conformanceHook, parseBool, showBool}}},
		{"kube-api-url", "BP_KUBE_API_URL", "URL of the API server for TokenReview (default: the in-cluster ServiceAccount's)", envValue[string]{&o.kubeAPIURL, str, showStr}},
		{"kube-ca-file", "BP_KUBE_CA_FILE", "CA bundle (PEM) of -kube-api-url", envValue[string]{&o.kubeCAFile, str, showStr}},
		{"kube-token-file", "BP_KUBE_TOKEN_FILE", "file with the bearer token to call -kube-api-url with (re-read on every review)", envValue[string]{&o.kubeTokenFile, str, showStr}},
		{"config-file", "BP_CONFIG_FILE", "mounted worker-config.json to watch", envValue[string]{&o.configFile, str, showStr}},
		{"duration", "BP_DURATION", "stop after this long, in seconds or as a Go duration (0: run until SIGTERM or SIGINT)", envValue[time.Duration]{&o.duration, parseSeconds, showDur}},
		{"messages", "BP_MESSAGES", "messages put on the queue at start", envValue[int]{&o.messages, func(s string) (int, error) {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 31)
			return int(n), err
		}, strconv.Itoa}},
		{"capacity", "BP_CAPACITY", "concurrent calls the dependency serves; the excess fails (0: unlimited)", envValue[int64]{&o.capacity, func(s string) (int64, error) {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 62)
			return int64(n), err
		}, func(n int64) string { return strconv.FormatInt(n, 10) }}},
		{"seed", "BP_SEED", "seed of the controller's probe jitter", envValue[uint64]{&o.seed, func(s string) (uint64, error) {
			return strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		}, func(n uint64) string { return strconv.FormatUint(n, 10) }}},
	}
	for _, s := range settings {
		if v := getenv(s.env); v != "" {
			if err := s.value.Set(v); err != nil {
				return o, fmt.Errorf("%s: %w", s.env, err)
			}
		}
		fs.Var(s.value, s.flag, s.usage+" ["+s.env+"]")
	}
	fs.DurationVar(&o.work, "work", o.work, "processing time of one message")
	fs.DurationVar(&o.outageAt, "outage-at", 0, "start of a full dependency outage after start (0: none)")
	fs.DurationVar(&o.outageFor, "outage-for", 0, "length of the outage")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.kubeAPIURL == "" && (o.kubeCAFile != "" || o.kubeTokenFile != "") {
		return o, errors.New("BP_KUBE_CA_FILE and BP_KUBE_TOKEN_FILE go with BP_KUBE_API_URL")
	}
	if o.kubeAPIURL != "" && o.kubeTokenFile == "" {
		return o, errors.New("BP_KUBE_API_URL needs BP_KUBE_TOKEN_FILE (the token to call it with)")
	}
	return o, nil
}

// verifier is the TokenReview verifier of o: the explicit API server, or the in-cluster one.
func verifier(o options) (*bp.TokenReviewVerifier, error) {
	var api bp.APIServerConfig
	namespace := o.namespace
	if o.kubeAPIURL != "" {
		if namespace == "" {
			return nil, errors.New("BP_NAMESPACE is needed with BP_KUBE_API_URL (the token audience names it)")
		}
		api = bp.APIServerConfig{URL: o.kubeAPIURL, CAFile: o.kubeCAFile, TokenFile: o.kubeTokenFile}
	} else {
		inCluster, ns, err := bp.InClusterAPIServer()
		if err != nil {
			return nil, fmt.Errorf("config pushes need Kubernetes credentials for TokenReview (BP_KUBE_API_URL outside a pod): %w", err)
		}
		api = inCluster
		if namespace == "" {
			namespace = ns
		}
	}
	return bp.NewTokenReviewVerifier(api, namespace, o.workload)
}

func main() {
	o, err := parseOptions(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, slog.Default()); err != nil {
		slog.Error("worker failed", "error", err)
		stop()
		os.Exit(1)
	}
}

// run serves the admin port and works the queue until ctx ends or o.duration has passed.
func run(ctx context.Context, o options, log *slog.Logger) error {
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	metrics := bp.NewMetrics(o.workload)
	initial := bp.DefaultWorkerConfig()
	gate := bp.NewGate(bp.FromConfig(&initial, o.seed), bp.WithMetrics(metrics), bp.WithSeed(o.seed), bp.WithLogger(log))
	state := bp.NewConfigState(gate, initial, metrics)
	admin := bp.NewAdmin(state, metrics)
	if len(o.allowed) > 0 {
		v, err := verifier(o)
		if err != nil {
			return err
		}
		log.Info("config pushes enabled", "audience", v.Audience(), "allowed", strings.Join(o.allowed, ","))
		admin.WithVerifier(v, o.allowed...)
	}
	if o.conformanceHook {
		log.Warn("conformance hook enabled: for conformance runs only", "path", bp.ConformanceHookPath)
		admin.WithConformanceHook()
	}
	listener, err := net.Listen("tcp", o.adminAddr)
	if err != nil {
		return fmt.Errorf("binding the admin port %s: %w", o.adminAddr, err)
	}
	log.Info("admin server listening", "addr", listener.Addr().String())
	served := make(chan error, 1)
	go func() { served <- admin.Serve(ctx, listener) }()
	if o.configFile != "" {
		go bp.NewFileWatcher(state, o.configFile).Run(ctx, bp.DefaultFilePoll)
	}

	// The queue and the dependency.
	queue := make(chan int, o.messages)
	for i := range o.messages {
		queue <- i
	}
	started := time.Now()
	var busy atomic.Int64
	call := func() bp.Outcome {
		n := busy.Add(1)
		defer busy.Add(-1)
		elapsed := time.Since(started)
		down := o.outageAt > 0 && elapsed >= o.outageAt && elapsed < o.outageAt+o.outageFor
		if down || (o.capacity > 0 && n > o.capacity) {
			time.Sleep(o.work / 4)
			return bp.DependencyFailure // a timeout, a 503, a 429: drives backoff
		}
		time.Sleep(time.Duration(float64(o.work) * (0.5 + rand.Float64())))
		return bp.Success
	}
	// poll takes up to n messages: it waits up to a short while for the first one.
	poll := func(n uint32) []int {
		var msgs []int
		timer := time.NewTimer(100 * time.Millisecond)
		defer timer.Stop()
		select {
		case m := <-queue:
			msgs = append(msgs, m)
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return nil
		}
		for uint32(len(msgs)) < n {
			select {
			case m := <-queue:
				msgs = append(msgs, m)
			default:
				return msgs
			}
		}
		return msgs
	}

	var done atomic.Int64
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s := gate.Snapshot()
			log.Info("status", "backoff", s.Backoff, "permits", s.Limit, "in_flight", s.InFlight,
				"mode", s.Mode.String(), "queued", len(queue), "done", done.Load(), "config", state.Ack().Hash)
		}
	}()

	// The worker loop: acquire permits, poll, process each message, report its outcome.
	var wg sync.WaitGroup
	for ctx.Err() == nil {
		permit, err := gate.Acquire(ctx, 10)
		if err != nil {
			break
		}
		for _, msg := range poll(permit.Granted()) {
			inflight := permit.Start()
			wg.Add(1)
			go func() {
				defer wg.Done()
				outcome := call()
				if outcome == bp.DependencyFailure {
					queue <- msg // redelivered later
				} else {
					done.Add(1)
				}
				inflight.Finish(outcome)
			}()
		}
		permit.Release()
	}
	wg.Wait()
	err = <-served
	log.Info("stopped", "done", done.Load(), "queued", len(queue), "elapsed", time.Since(started).String())
	return err
}
