package backpressure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Admin endpoint paths and defaults (the Rust worker's config::admin).
const (
	HealthzPath          = "/healthz"
	MetricsPath          = "/metrics"
	DefaultHeaderTimeout = 5 * time.Second
	DefaultBodyTimeout   = 10 * time.Second
)

// FailureLimit is how many failed authentications a source (an IP address) may make: a
// bucket of Burst failures refilled by one every Refill. A source whose bucket is empty gets
// 429 for every push, before its token is looked at; successful pushes cost nothing.
type FailureLimit struct {
	Burst  uint32
	Refill time.Duration
}

// DefaultFailureLimit is 10 failures, one forgiven every 2 s.
func DefaultFailureLimit() FailureLimit { return FailureLimit{Burst: 10, Refill: 2 * time.Second} }

// maxSources: beyond it, sources with a full bucket are forgotten, and if all are busy, new
// sources share one bucket.
const maxSources = 4096

type bucket struct {
	credit float64
	at     time.Time
}

type limiter struct {
	limit   FailureLimit
	mu      sync.Mutex
	buckets map[string]bucket
	now     func() time.Time
}

func newLimiter(l FailureLimit, now func() time.Time) *limiter {
	return &limiter{limit: l, buckets: map[string]bucket{}, now: now}
}

func (l *limiter) burst() float64 { return float64(maxU32(l.limit.Burst, 1)) }

func (l *limiter) refilled(b bucket, now time.Time) bucket {
	gained := l.burst()
	if per := l.limit.Refill.Seconds(); per > 0 {
		elapsed := now.Sub(b.at)
		if elapsed < 0 {
			elapsed = 0
		}
		gained = elapsed.Seconds() / per
	}
	return bucket{credit: math.Min(b.credit+gained, l.burst()), at: now}
}

func (l *limiter) key(source string) string {
	if _, ok := l.buckets[source]; ok || len(l.buckets) < maxSources {
		return source
	}
	return ""
}

// throttled is how long source must wait before it may try to authenticate (0: it may).
func (l *limiter) throttled(source string) time.Duration {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.key(source)
	b, ok := l.buckets[k]
	if !ok {
		return 0
	}
	b = l.refilled(b, now)
	l.buckets[k] = b
	if b.credit >= 1 {
		return 0
	}
	return time.Duration(float64(l.limit.Refill) * clampF(1-b.credit, 0, 1))
}

// failed charges one failed authentication to source.
func (l *limiter) failed(source string) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.buckets[source]; !ok && len(l.buckets) >= maxSources {
		for k, b := range l.buckets {
			if l.refilled(b, now).credit >= l.burst() {
				delete(l.buckets, k)
			}
		}
	}
	k := l.key(source)
	b, ok := l.buckets[k]
	if ok {
		b = l.refilled(b, now)
	} else {
		b = bucket{credit: l.burst(), at: now}
	}
	l.buckets[k] = bucket{credit: math.Max(b.credit-1, 0), at: now}
}

// Admin is the admin HTTP endpoint of a worker (an http.Handler): PUT and GET /v1/config,
// GET /metrics and GET /healthz, with the Rust worker's answers: 200 with {hash, generation}
// when a push is applied or already running, 400 for a malformed or invalid payload, 401
// without a valid token, 403 for a valid token of an identity that is not allowed, 408 when
// the body does not arrive in time, 409 for a payload older than the running generation, 413
// for a body over MaxPayloadBytes, 429 (with Retry-After) for a source that failed
// authentication too often, 503 when the token cannot be checked. The token is checked before
// the body is read. Errors are JSON {"error": "..."}. WithConformanceHook adds POST
// ConformanceHookPath for conformance runs.
type Admin struct {
	state         *ConfigState
	metrics       *Metrics
	verifier      TokenVerifier
	allowed       []string
	headerTimeout time.Duration
	bodyTimeout   time.Duration
	limiter       *limiter
	now           func() time.Time
	logger        *slog.Logger
	// conformanceHook serves POST ConformanceHookPath (WithConformanceHook).
	conformanceHook bool
}

// NewAdmin is a worker's admin endpoint; metrics may be nil. It accepts no pushes until
// WithVerifier.
func NewAdmin(state *ConfigState, metrics *Metrics) *Admin {
	a := &Admin{
		state:         state,
		metrics:       metrics,
		headerTimeout: DefaultHeaderTimeout,
		bodyTimeout:   DefaultBodyTimeout,
		now:           time.Now,
		logger:        state.logger,
	}
	a.limiter = newLimiter(DefaultFailureLimit(), func() time.Time { return a.now() })
	return a
}

// WithVerifier accepts pushes whose token verifier maps to one of the allowed usernames (for
// a ServiceAccount, see ServiceAccountUsername).
func (a *Admin) WithVerifier(verifier TokenVerifier, allowed ...string) *Admin {
	a.verifier = verifier
	a.allowed = append([]string(nil), allowed...)
	return a
}

// WithFailureLimit sets the per-source limit on failed authentications.
func (a *Admin) WithFailureLimit(l FailureLimit) *Admin {
	a.limiter = newLimiter(l, func() time.Time { return a.now() })
	return a
}

// WithTimeouts sets the time allowed for a request's headers (used by Server) and body.
func (a *Admin) WithTimeouts(headers, body time.Duration) *Admin {
	a.headerTimeout, a.bodyTimeout = headers, body
	return a
}

// WithConformanceHook also serves the conformance hook, POST ConformanceHookPath: the
// golden-vector case in the body run on a fresh controller (ConformanceCase.Run), answered
// with {"observations": [...]}; 400 for a body that is not a case, 413 over
// MaxConformanceCaseBytes. For conformance runs only: the hook takes no token (it touches no
// state of the worker, but a case costs CPU), so it is off by default and the path answers
// 404 without this option.
func (a *Admin) WithConformanceHook() *Admin {
	a.conformanceHook = true
	return a
}

// State is the configuration state served.
func (a *Admin) State() *ConfigState { return a.state }

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"encoding the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]string{"error": message})
}

// ServeHTTP answers one request.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case HealthzPath:
		if r.Method != http.MethodGet {
			writeError(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	case MetricsPath:
		if r.Method != http.MethodGet {
			writeError(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		if a.metrics == nil {
			writeError(w, http.StatusNotFound, "no metrics registered")
			return
		}
		a.metrics.Handler().ServeHTTP(w, r)
	case ConfigPath:
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, a.state.Ack())
		case http.MethodPut:
			a.push(w, r)
		default:
			writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		}
	case ConformanceHookPath:
		// Like the Rust worker: only POST, and only when enabled; anything else is not found.
		if !a.conformanceHook || r.Method != http.MethodPost {
			writeError(w, http.StatusNotFound, "not found")
			return
		}
		a.hook(w, r)
	default:
		writeError(w, http.StatusNotFound, "not found")
	}
}

// hook answers the conformance hook: the case in the body run on a fresh controller.
func (a *Admin) hook(w http.ResponseWriter, r *http.Request) {
	body, ok := a.readBody(w, r, MaxConformanceCaseBytes, "case")
	if !ok {
		return
	}
	out, err := RunConformanceCase(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Admin) push(w http.ResponseWriter, r *http.Request) {
	identity, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	body, ok := a.readBody(w, r, MaxPayloadBytes, "document")
	if !ok {
		return
	}
	ack, err := a.state.ApplyBytes(body, OriginPush)
	var tooLarge *TooLargeError
	var stale *StaleError
	switch {
	case err == nil:
		a.logger.Info("push accepted", "user", identity.Username, "hash", ack.Hash, "generation", ack.Generation)
		writeJSON(w, http.StatusOK, ack)
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case errors.As(err, &stale):
		writeError(w, http.StatusConflict, err.Error())
	default:
		writeError(w, http.StatusBadRequest, err.Error())
	}
}

// source is the peer IP address of a request.
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// authenticate is the pusher's identity, or the refusal written: the failure limit first
// (429), then the bearer token (401), the verifier (401, 503) and the allowed identities
// (403). Every failure but an unavailable verifier is charged to the source.
func (a *Admin) authenticate(w http.ResponseWriter, r *http.Request) (Identity, bool) {
	if a.verifier == nil {
		writeError(w, http.StatusUnauthorized, "pushes are disabled on this pod")
		return Identity{}, false
	}
	src := source(r)
	if wait := a.limiter.throttled(src); wait > 0 {
		secs := max(int64(wait/time.Second), 1)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		writeError(w, http.StatusTooManyRequests, "too many failed authentications from this address; retry later")
		return Identity{}, false
	}
	token, ok := bearer(r)
	if !ok {
		a.limiter.failed(src)
		writeError(w, http.StatusUnauthorized, "missing bearer token")
		return Identity{}, false
	}
	id, err := a.verifier.Verify(r.Context(), token)
	var unavailable *UnavailableError
	switch {
	case err == nil:
	case errors.As(err, &unavailable):
		a.logger.Warn("push refused: cannot review the token", "error", err)
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return Identity{}, false
	default:
		a.limiter.failed(src)
		a.logger.Warn("push refused: unauthenticated", "error", err, "source", src)
		var ue *UnauthenticatedError
		if !errors.As(err, &ue) {
			err = &UnauthenticatedError{err.Error()}
		}
		writeError(w, http.StatusUnauthorized, err.Error())
		return Identity{}, false
	}
	for _, allowed := range a.allowed {
		if allowed == id.Username {
			return id, true
		}
	}
	a.limiter.failed(src)
	a.logger.Warn("push refused: identity not allowed", "user", id.Username, "source", src)
	writeError(w, http.StatusForbidden, id.Username+" may not configure this pod")
	return Identity{}, false
}

func bearer(r *http.Request) (string, bool) {
	value := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(value, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return "", false
	}
	return token, true
}

// readBody reads at most limit bytes (413) within the body timeout (408); what names the
// body in the 413 answer.
func (a *Admin) readBody(w http.ResponseWriter, r *http.Request, limit int64, what string) ([]byte, bool) {
	if r.ContentLength > limit {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%s of %d bytes exceeds the limit of %d bytes", what, r.ContentLength, limit))
		return nil, false
	}
	// The deadline applies to a real connection; a handler called directly has none.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.bodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case err == nil:
		return body, true
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("%s exceeds the limit of %d bytes", what, limit))
	case errors.As(err, &netErr) && netErr.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		// The connection cannot be read any more: answer and close it.
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, "request body timed out")
	default:
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
	}
	return nil, false
}

// Server is an http.Server for this endpoint on addr, with its header timeout (a client that
// never finishes its headers is disconnected).
func (a *Admin) Server(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           a,
		ReadHeaderTimeout: a.headerTimeout,
		IdleTimeout:       2 * time.Minute,
	}
}

// Serve serves connections from listener until ctx ends (connections in progress are given
// a few seconds to finish).
func (a *Admin) Serve(ctx context.Context, listener net.Listener) error {
	srv := a.Server(listener.Addr().String())
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdown)
		case <-done:
		}
	}()
	err := srv.Serve(listener)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
