// Command lab-worker-go is the lab's worker in Go, built on the Go SDK exactly as an adopter
// would build one: the permit gate (bp.Gate) decides how many messages to fetch, every
// message's outcome goes to the gate's controller, the admin server (bp.Admin) serves
// /metrics, /healthz and GET/PUT /v1/config, and pushes are authenticated with a TokenReview
// (bp.TokenReviewVerifier) so that only the operator can push, and only with a token for this
// pod's audience (backpressure.dev/<namespace>/<workload>).
//
// It consumes the lab's Redis-stream queue with the same semantics as the Rust lab worker
// (crates/lab/src/worker.rs): the same Lua scripts, read from -scripts (crates/lab/lua/, which
// the Rust side includes at build time), the same poll (at most the permits granted, at most
// 16, a 100 ms pause after an empty poll), local work then one POST <dependency>/work per
// message (2 s timeout), 2xx = success (ack), 429/5xx/no answer = dependency failure (nack),
// any other status = message failure (nack). A nacked message is delivered again after the
// visibility timeout; one delivered more than -max-deliveries times is dead-lettered by the
// fetch script.
//
// It runs until SIGTERM or SIGINT, then finishes the messages in flight and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	bp "github.com/backpressure-dev/backpressure-operator/sdk/go"
	"github.com/redis/go-redis/v9"
)

const (
	// group and retryConsumer are the queue's consumer group and the consumer that holds
	// nacked messages (crates/lab/src/queue.rs: GROUP, RETRY_CONSUMER).
	group         = "workers"
	retryConsumer = "~retry"
	// maxBatch is the most messages one poll fetches (the Rust worker's WorkerLoop::max_batch).
	maxBatch = 16
	// emptyWait is the pause after an empty poll (the Rust worker's RedisSource).
	emptyWait = 100 * time.Millisecond
	// pollErrorPause is the pause after a failed poll (the worker library's default).
	pollErrorPause = time.Second
)

type options struct {
	listen, redisURL, queue, consumer, dependency string
	workload, namespace, configFile, scripts      string
	kubeAPIURL, kubeCAFile, kubeTokenFile         string
	allowed                                       []string
	processing, visibility                        time.Duration
	maxDeliveries                                 uint
	seed                                          uint64
}

type listFlag struct{ into *[]string }

func (l listFlag) String() string {
	if l.into == nil {
		return ""
	}
	return strings.Join(*l.into, ",")
}

func (l listFlag) Set(s string) error {
	*l.into = append(*l.into, s)
	return nil
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("lab-worker-go", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", "", "address for metrics and admin (<pod ip>:9464)")
	fs.StringVar(&o.redisURL, "redis", "", "Redis URL")
	fs.StringVar(&o.queue, "queue", "", "queue key prefix")
	fs.StringVar(&o.consumer, "consumer", "", "consumer name (the pod name)")
	fs.StringVar(&o.dependency, "dependency", "", "dependency base URL")
	fs.StringVar(&o.workload, "workload", "", "workload label")
	fs.StringVar(&o.namespace, "namespace", "", "the pod's namespace (the push token audience names it)")
	fs.DurationVar(&o.processing, "processing", 0, "local work per message")
	fs.DurationVar(&o.visibility, "visibility-timeout", 0, "visibility timeout of the queue")
	fs.UintVar(&o.maxDeliveries, "max-deliveries", 0, "deliveries before dead-lettering")
	fs.StringVar(&o.configFile, "config", "", "initial worker configuration (JSON, the wire contract)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the probe jitter; each pod's is derived from it and -consumer")
	fs.StringVar(&o.scripts, "scripts", "", "directory of the queue's Lua scripts (crates/lab/lua)")
	fs.StringVar(&o.kubeAPIURL, "kube-api-url", "", "API server for the TokenReview of config pushes")
	fs.StringVar(&o.kubeCAFile, "kube-ca-file", "", "its CA bundle (PEM)")
	fs.StringVar(&o.kubeTokenFile, "kube-token-file", "", "this pod's ServiceAccount token to call it with")
	fs.Var(listFlag{&o.allowed}, "allowed-identity", "identity allowed to push configuration (repeatable)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for name, v := range map[string]string{
		"listen": o.listen, "redis": o.redisURL, "queue": o.queue, "consumer": o.consumer,
		"dependency": o.dependency, "workload": o.workload, "namespace": o.namespace,
		"config": o.configFile, "scripts": o.scripts,
	} {
		if v == "" {
			return o, fmt.Errorf("-%s is required", name)
		}
	}
	if o.visibility <= 0 || o.maxDeliveries == 0 {
		return o, errors.New("-visibility-timeout and -max-deliveries must be positive")
	}
	if len(o.allowed) > 0 && (o.kubeAPIURL == "" || o.kubeTokenFile == "") {
		return o, errors.New("-allowed-identity needs -kube-api-url and -kube-token-file (the TokenReview)")
	}
	return o, nil
}

// podSeed is the probe-jitter seed of the pod named consumer: the -consumer name's bytes folded
// into -seed as the Rust lab does it
// (`consumer.bytes().fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))`, uint64
// wrapping), so the pods of one Deployment, which all get the same -seed, do not probe in step.
func podSeed(seed uint64, consumer string) uint64 {
	h := seed
	for i := 0; i < len(consumer); i++ {
		h = h*31 + uint64(consumer[i])
	}
	return h
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab-worker-go:", err)
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

func run(ctx context.Context, o options, log *slog.Logger) error {
	data, err := os.ReadFile(o.configFile)
	if err != nil {
		return err
	}
	initial, err := bp.ParseWorkerConfig(data)
	if err != nil {
		return fmt.Errorf("%s: %w", o.configFile, err)
	}
	metrics := bp.NewMetrics(o.workload)
	seed := podSeed(o.seed, o.consumer)
	gate := bp.NewGate(bp.FromConfig(&initial, seed), bp.WithMetrics(metrics), bp.WithSeed(seed), bp.WithLogger(log))
	state := bp.NewConfigState(gate, initial, metrics)
	admin := bp.NewAdmin(state, metrics)
	if len(o.allowed) > 0 {
		api := bp.APIServerConfig{URL: o.kubeAPIURL, CAFile: o.kubeCAFile, TokenFile: o.kubeTokenFile}
		v, err := bp.NewTokenReviewVerifier(api, o.namespace, o.workload)
		if err != nil {
			return err
		}
		admin.WithVerifier(v, o.allowed...)
		log.Info("config pushes enabled", "audience", v.Audience(), "allowed", strings.Join(o.allowed, ","))
	}
	q, err := newQueue(o)
	if err != nil {
		return err
	}
	defer q.rdb.Close()
	listener, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("binding the admin port %s: %w", o.listen, err)
	}
	served := make(chan error, 1)
	go func() { served <- admin.Serve(ctx, listener) }()
	log.Info("admin server listening", "addr", listener.Addr().String())

	dep := &dependency{
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		url:  strings.TrimRight(o.dependency, "/") + "/work", processing: o.processing,
	}
	outcomes := workLoop(ctx, gate, q, dep, log)
	log.Info("worker stopped", "success", outcomes[bp.Success], "dependency_failure", outcomes[bp.DependencyFailure],
		"message_failure", outcomes[bp.MessageFailure])
	return <-served
}

// workLoop is the worker loop: acquire permits, poll at most that many messages, process each
// in its own goroutine, report its outcome to the gate, ack or nack it. It returns when ctx ends,
// after the messages in flight are settled (with a fresh context: the queue outlives the pod's
// stop signal).
func workLoop(ctx context.Context, gate *bp.Gate, q *queue, dep *dependency, log *slog.Logger) map[bp.Outcome]uint64 {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[bp.Outcome]uint64{}
	)
	settleCtx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		permit, err := gate.Acquire(ctx, maxBatch)
		if err != nil {
			break
		}
		msgs, err := q.fetch(ctx, int(permit.Granted()))
		if err != nil {
			permit.Release()
			if ctx.Err() == nil {
				log.Warn("poll failed", "error", err)
				sleep(ctx, pollErrorPause)
			}
			continue
		}
		for _, m := range msgs {
			slot := permit.Start()
			wg.Add(1)
			go func() {
				defer wg.Done()
				outcome := dep.handle(settleCtx, m)
				var settleErr error
				if outcome == bp.Success {
					settleErr = q.ack(settleCtx, m.id)
				} else {
					settleErr = q.nack(settleCtx, m.id)
				}
				if settleErr != nil {
					log.Warn("ack/nack failed", "id", m.id, "error", settleErr)
				}
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
				slot.Finish(outcome)
			}()
		}
		// Unused permits (an empty or short poll) go back here.
		permit.Release()
		if len(msgs) == 0 {
			sleep(ctx, emptyWait)
		}
	}
	wg.Wait()
	return outcomes
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// delivery is one delivered message.
type delivery struct {
	id         string
	deliveries int64
	body       string
}

// queue is one logical queue of the lab (keys <prefix>:stream, :dlq, :deadcount, :cursor,
// :completed) driven by the lab's Lua scripts.
type queue struct {
	rdb                    *redis.Client
	prefix, consumer       string
	visibilityMs           int64
	maxDeliveries          uint
	fetchScript, ackScript *redis.Script
	nackScript             *redis.Script
}

func newQueue(o options) (*queue, error) {
	opt, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", err)
	}
	script := func(name string) (*redis.Script, error) {
		src, err := os.ReadFile(filepath.Join(o.scripts, name))
		if err != nil {
			return nil, err
		}
		return redis.NewScript(string(src)), nil
	}
	q := &queue{
		rdb: redis.NewClient(opt), prefix: o.queue, consumer: o.consumer,
		visibilityMs: o.visibility.Milliseconds(), maxDeliveries: o.maxDeliveries,
	}
	if q.fetchScript, err = script("fetch.lua"); err != nil {
		return nil, err
	}
	if q.ackScript, err = script("ack.lua"); err != nil {
		return nil, err
	}
	if q.nackScript, err = script("nack.lua"); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *queue) key(what string) string { return q.prefix + ":" + what }

// fetch delivers up to max messages to this consumer: reclaimed ones first, then new ones.
func (q *queue) fetch(ctx context.Context, max int) ([]delivery, error) {
	if max <= 0 {
		return nil, nil
	}
	keys := []string{q.key("stream"), q.key("dlq"), q.key("deadcount"), q.key("cursor")}
	v, err := q.fetchScript.Run(ctx, q.rdb, keys, group, q.consumer, max, q.visibilityMs, q.maxDeliveries).Result()
	if err != nil {
		return nil, err
	}
	return parseDeliveries(v)
}

// parseDeliveries reads the fetch script's answer: a list of {id, deliveries, {field, value...}}.
func parseDeliveries(v any) ([]delivery, error) {
	items, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("fetch: unexpected reply %T", v)
	}
	out := make([]delivery, 0, len(items))
	for _, it := range items {
		e, ok := it.([]any)
		if !ok || len(e) < 3 {
			return nil, fmt.Errorf("fetch: unexpected entry %v", it)
		}
		id, ok1 := e[0].(string)
		n, ok2 := e[1].(int64)
		fields, ok3 := e[2].([]any)
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("fetch: unexpected entry %v", it)
		}
		d := delivery{id: id, deliveries: n}
		for i := 0; i+1 < len(fields); i += 2 {
			if k, _ := fields[i].(string); k == "body" {
				d.body, _ = fields[i+1].(string)
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// ack acknowledges a processed message (and counts a completion once).
func (q *queue) ack(ctx context.Context, id string) error {
	return q.ackScript.Run(ctx, q.rdb, []string{q.key("stream"), q.key("completed")}, group, id).Err()
}

// nack gives a failed message back: it is delivered again after the visibility timeout.
func (q *queue) nack(ctx context.Context, id string) error {
	return q.nackScript.Run(ctx, q.rdb, []string{q.key("stream")}, group, retryConsumer, id).Err()
}

// dependency processes a message: local work, then one call to the dependency.
type dependency struct {
	http       *http.Client
	url        string
	processing time.Duration
}

func (d *dependency) handle(ctx context.Context, m delivery) bp.Outcome {
	sleep(ctx, d.processing)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, strings.NewReader(m.body))
	if err != nil {
		return classify(0)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return classify(0)
	}
	resp.Body.Close()
	return classify(resp.StatusCode)
}

// classify is the Rust lab worker's classify: 2xx success; 429, 5xx or no answer (0) a
// dependency failure; anything else a message failure.
func classify(status int) bp.Outcome {
	switch {
	case status >= 200 && status <= 299:
		return bp.Success
	case status == 0 || status == 429 || (status >= 500 && status <= 599):
		return bp.DependencyFailure
	default:
		return bp.MessageFailure
	}
}
