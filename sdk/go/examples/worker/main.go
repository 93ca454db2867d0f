// Command worker is an example queue worker built on the Go SDK: an in-memory queue, a
// simulated dependency with an optional outage and capacity limit, the permit gate, the admin
// server (/metrics, /healthz, GET and PUT /v1/config) and an optional hot-reloaded config file.
//
//	go run ./examples/worker -messages 5000 -outage-at 5s -outage-for 20s
//	curl -s 127.0.0.1:9464/metrics
//
// With -allowed-identity (e.g. system:serviceaccount:bp-system:backpressure-operator) it
// accepts pushes checked with a TokenReview through the in-cluster ServiceAccount.
package main

import (
	"context"
	"flag"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bp "github.com/backpressure-dev/backpressure-operator/sdk/go"
)

func main() {
	workload := flag.String("workload", envOr("BP_WORKLOAD", "example-worker"), "workload name (the workload label of every metric)")
	addr := flag.String("admin-addr", envOr("BP_ADMIN_ADDR", "127.0.0.1:9464"), "admin server address")
	configFile := flag.String("config-file", os.Getenv("BP_CONFIG_FILE"), "mounted worker-config.json to watch")
	namespace := flag.String("namespace", os.Getenv("BP_NAMESPACE"), "the pod's namespace (default: the ServiceAccount's)")
	allowed := flag.String("allowed-identity", os.Getenv("BP_ALLOWED_IDENTITIES"), "comma-separated usernames allowed to push configuration")
	messages := flag.Int("messages", 1000, "messages put on the queue at start")
	work := flag.Duration("work", 50*time.Millisecond, "processing time of one message")
	capacity := flag.Int64("capacity", 0, "concurrent calls the dependency serves; the excess fails (0: unlimited)")
	outageAt := flag.Duration("outage-at", 0, "start of a full dependency outage after start (0: none)")
	outageFor := flag.Duration("outage-for", 0, "length of the outage")
	seed := flag.Uint64("seed", 1, "seed of the controller's probe jitter")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.Default()

	metrics := bp.NewMetrics(*workload)
	initial := bp.DefaultWorkerConfig()
	gate := bp.NewGate(bp.FromConfig(&initial, *seed), bp.WithMetrics(metrics), bp.WithSeed(*seed))
	state := bp.NewConfigState(gate, initial, metrics)
	admin := bp.NewAdmin(state, metrics)
	if *allowed != "" {
		api, ns, err := bp.InClusterAPIServer()
		if err != nil {
			log.Error("config pushes need Kubernetes credentials for TokenReview", "error", err)
			os.Exit(1)
		}
		if *namespace != "" {
			ns = *namespace
		}
		verifier, err := bp.NewTokenReviewVerifier(api, ns, *workload)
		if err != nil {
			log.Error("TokenReview client", "error", err)
			os.Exit(1)
		}
		log.Info("config pushes enabled", "audience", verifier.Audience())
		admin.WithVerifier(verifier, strings.Split(*allowed, ",")...)
	}
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Error("binding the admin port", "addr", *addr, "error", err)
		os.Exit(1)
	}
	log.Info("admin server listening", "addr", listener.Addr().String())
	go func() { _ = admin.Serve(ctx, listener) }()
	if *configFile != "" {
		go bp.NewFileWatcher(state, *configFile).Run(ctx, bp.DefaultFilePoll)
	}

	// The queue and the dependency.
	queue := make(chan int, *messages)
	for i := range *messages {
		queue <- i
	}
	started := time.Now()
	var busy atomic.Int64
	call := func() bp.Outcome {
		n := busy.Add(1)
		defer busy.Add(-1)
		elapsed := time.Since(started)
		down := *outageAt > 0 && elapsed >= *outageAt && elapsed < *outageAt+*outageFor
		if down || (*capacity > 0 && n > *capacity) {
			time.Sleep(*work / 4)
			return bp.DependencyFailure // a timeout, a 503, a 429: drives backoff
		}
		time.Sleep(time.Duration(float64(*work) * (0.5 + rand.Float64())))
		return bp.Success
	}

	// The worker loop: acquire permits, poll, process each message, report its outcome.
	var wg sync.WaitGroup
	var done atomic.Int64
	go func() {
		for range time.Tick(time.Second) {
			s := gate.Snapshot()
			log.Info("status", "backoff", s.Backoff, "permits", s.Limit, "in_flight", s.InFlight,
				"mode", s.Mode.String(), "queued", len(queue), "done", done.Load(), "config", state.Ack().Hash)
		}
	}()
	for ctx.Err() == nil && (len(queue) > 0 || gate.Snapshot().InFlight > 0) {
		permit, err := gate.Acquire(ctx, 10)
		if err != nil {
			break
		}
		for range permit.Granted() {
			var msg int
			select {
			case msg = <-queue:
			default:
				continue
			}
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
		if len(queue) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	wg.Wait()
	log.Info("stopped", "done", done.Load(), "elapsed", time.Since(started).String())
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
