package backpressure

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Identity is who a token belongs to.
type Identity struct {
	// Username is the authenticated username; for a ServiceAccount
	// system:serviceaccount:<namespace>:<name>.
	Username string
}

// UnauthenticatedError: the token is not valid, or not for our audience (HTTP 401).
type UnauthenticatedError struct{ Reason string }

func (e *UnauthenticatedError) Error() string { return "token not authenticated: " + e.Reason }

// UnavailableError: the token could not be checked, e.g. the API server is unreachable
// (HTTP 503).
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return "token review unavailable: " + e.Reason }

// TokenVerifier checks a bearer token. Verify returns an *UnauthenticatedError or an
// *UnavailableError when it does not accept it.
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (Identity, error)
}

// ServiceAccountUsername is the username of a ServiceAccount.
func ServiceAccountUsername(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// MaxTokenBytes is the longest token looked at; a ServiceAccount token is about 1 KiB.
const MaxTokenBytes = 16 * 1024

// CheckJWT is the local check of a token before any TokenReview: a JWT (three base64url
// parts, the first two JSON objects) whose exp is after nowUnix and whose aud (a string or a
// list) contains audience. The signature is NOT checked (the TokenReview that follows does).
// The error says which part is wrong, never the token.
func CheckJWT(token, audience string, nowUnix int64) error {
	if len(token) > MaxTokenBytes {
		return fmt.Errorf("token longer than %d bytes", MaxTokenBytes)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return errors.New("not a JWT (expected three dot-separated parts)")
	}
	if parts[2] == "" {
		return errors.New("not a JWT (empty signature)")
	}
	object := func(part, name string) (map[string]any, error) {
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(part, "="))
		if err != nil {
			return nil, fmt.Errorf("not a JWT (%s is not base64url)", name)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("not a JWT (%s is not JSON)", name)
		}
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("not a JWT (%s is not a JSON object)", name)
		}
		return m, nil
	}
	if _, err := object(parts[0], "header"); err != nil {
		return err
	}
	claims, err := object(parts[1], "payload")
	if err != nil {
		return err
	}
	exp, ok := claims["exp"].(float64)
	if !ok {
		return errors.New("token has no exp claim")
	}
	if !(exp > float64(nowUnix)) {
		return errors.New("token expired")
	}
	ours := false
	switch aud := claims["aud"].(type) {
	case string:
		ours = aud == audience
	case []any:
		for _, a := range aud {
			if s, ok := a.(string); ok && s == audience {
				ours = true
			}
		}
	}
	if !ours {
		return fmt.Errorf("token is not for audience %q", audience)
	}
	return nil
}

// Cache defaults of TokenReviewVerifier.
const (
	// DefaultReviewCacheTTL is how long a positive review is cached.
	DefaultReviewCacheTTL = 60 * time.Second
	// DefaultNegativeTTL is how long a refused token is refused without asking again.
	DefaultNegativeTTL = 30 * time.Second
	// NegativeCacheMax is the most tokens remembered as refused.
	NegativeCacheMax = 1024
	reviewCacheMax   = 256
)

// negativeCache holds SHA-256 keys of tokens the API server refused recently, bounded.
type negativeCache struct {
	ttl     time.Duration
	max     int
	mu      sync.Mutex
	entries map[[32]byte]time.Time
	now     func() time.Time
}

func newNegativeCache(ttl time.Duration, max int) *negativeCache {
	return &negativeCache{ttl: ttl, max: maxInt(max, 1), entries: map[[32]byte]time.Time{}, now: time.Now}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func (c *negativeCache) contains(key [32]byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.entries[key]
	return ok && c.now().Before(until)
}

func (c *negativeCache) insert(key [32]byte) {
	if c.ttl <= 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k, until := range c.entries {
			if !until.After(now) {
				delete(c.entries, k)
			}
		}
		for len(c.entries) >= c.max {
			var oldest [32]byte
			var at time.Time
			first := true
			for k, until := range c.entries {
				if first || until.Before(at) {
					oldest, at, first = k, until, false
				}
			}
			delete(c.entries, oldest)
		}
	}
	c.entries[key] = now.Add(c.ttl)
}

func (c *negativeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// The in-cluster ServiceAccount files.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// APIServerConfig says how to reach the Kubernetes API server.
type APIServerConfig struct {
	// URL of the API server, e.g. https://10.96.0.1:443.
	URL string
	// CAFile is a PEM bundle to verify the API server with (CAPEM wins when both are set).
	CAFile string
	// CAPEM is a PEM bundle to verify the API server with.
	CAPEM []byte
	// TokenFile holds the bearer token of this worker's ServiceAccount; it is re-read on every
	// review (kubelet rotates projected tokens). Token wins when both are set.
	TokenFile string
	// Token is a fixed bearer token.
	Token string
	// Timeout of one review (default 10 s).
	Timeout time.Duration
}

// InClusterAPIServer is the in-cluster configuration: KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT, and the ServiceAccount's token and CA files. It also returns the
// pod's namespace from the ServiceAccount's namespace file.
func InClusterAPIServer() (APIServerConfig, string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return APIServerConfig{}, "", errors.New("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	ns, err := os.ReadFile(serviceAccountDir + "/namespace")
	if err != nil {
		return APIServerConfig{}, "", fmt.Errorf("reading the ServiceAccount namespace: %w", err)
	}
	return APIServerConfig{
		URL:       "https://" + net.JoinHostPort(host, port),
		CAFile:    serviceAccountDir + "/ca.crt",
		TokenFile: serviceAccountDir + "/token",
	}, strings.TrimSpace(string(ns)), nil
}

// TokenReviewVerifier verifies tokens with a Kubernetes TokenReview for one audience,
// PushAudience(namespace, workload), over plain HTTPS to the API server (the Rust worker's
// TokenReviewVerifier). The worker's ServiceAccount needs create on
// tokenreviews.authentication.k8s.io (the system:auth-delegator ClusterRole). Before a review
// it checks the token locally (CheckJWT), answers from a short cache of positive reviews and
// refuses a token the API server refused in the last DefaultNegativeTTL. Tokens are never
// logged; the caches are keyed by the token's SHA-256.
type TokenReviewVerifier struct {
	api      APIServerConfig
	client   *http.Client
	audience string
	ttl      time.Duration
	mu       sync.Mutex
	cache    map[[32]byte]cachedIdentity
	refused  *negativeCache
	now      func() time.Time
}

type cachedIdentity struct {
	id    Identity
	until time.Time
}

// NewTokenReviewVerifier is a verifier for the workers of workload in namespace (the pod's
// own namespace and the workload label of its metrics: both known to the worker without
// trusting whoever pushes).
func NewTokenReviewVerifier(api APIServerConfig, namespace, workload string) (*TokenReviewVerifier, error) {
	return NewTokenReviewVerifierForAudience(api, PushAudience(namespace, workload))
}

// NewTokenReviewVerifierForAudience is a verifier for an explicit audience.
func NewTokenReviewVerifierForAudience(api APIServerConfig, audience string) (*TokenReviewVerifier, error) {
	if api.URL == "" {
		return nil, errors.New("no API server URL")
	}
	pem := api.CAPEM
	if pem == nil && api.CAFile != "" {
		var err error
		if pem, err = os.ReadFile(api.CAFile); err != nil {
			return nil, fmt.Errorf("reading the API server CA: %w", err)
		}
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if pem != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errors.New("the API server CA bundle holds no PEM certificate")
		}
		tlsConfig.RootCAs = pool
	}
	timeout := api.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	return &TokenReviewVerifier{
		api:      api,
		client:   &http.Client{Transport: transport, Timeout: timeout},
		audience: audience,
		ttl:      DefaultReviewCacheTTL,
		cache:    map[[32]byte]cachedIdentity{},
		refused:  newNegativeCache(DefaultNegativeTTL, NegativeCacheMax),
		now:      time.Now,
	}, nil
}

// Audience is the audience accepted.
func (v *TokenReviewVerifier) Audience() string { return v.audience }

// SetCacheTTL caches positive reviews for ttl (0 disables the cache).
func (v *TokenReviewVerifier) SetCacheTTL(ttl time.Duration) { v.ttl = ttl }

// SetNegativeTTL remembers refused tokens for ttl (0 disables the negative cache).
func (v *TokenReviewVerifier) SetNegativeTTL(ttl time.Duration) {
	v.refused = newNegativeCache(ttl, NegativeCacheMax)
}

// Verify implements TokenVerifier.
func (v *TokenReviewVerifier) Verify(ctx context.Context, token string) (Identity, error) {
	// First, so that a cached token stops working at its exp, not up to a TTL later.
	if err := CheckJWT(token, v.audience, v.now().Unix()); err != nil {
		return Identity{}, &UnauthenticatedError{err.Error()}
	}
	key := sha256Sum(token)
	if id, ok := v.cached(key); ok {
		return id, nil
	}
	if v.refused.contains(key) {
		return Identity{}, &UnauthenticatedError{"token refused by the API server within the last seconds"}
	}
	id, err := v.ask(ctx, token)
	var ue *UnauthenticatedError
	switch {
	case err == nil:
		v.remember(key, id)
	case errors.As(err, &ue):
		v.refused.insert(key)
	}
	return id, err
}

func (v *TokenReviewVerifier) cached(key [32]byte) (Identity, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c, ok := v.cache[key]
	if ok && v.now().Before(c.until) {
		return c.id, true
	}
	return Identity{}, false
}

func (v *TokenReviewVerifier) remember(key [32]byte, id Identity) {
	if v.ttl <= 0 {
		return
	}
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.cache) >= reviewCacheMax {
		for k, c := range v.cache {
			if !c.until.After(now) {
				delete(v.cache, k)
			}
		}
		if len(v.cache) >= reviewCacheMax {
			clear(v.cache)
		}
	}
	v.cache[key] = cachedIdentity{id, now.Add(v.ttl)}
}

type tokenReview struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Spec       tokenReviewSpec   `json:"spec"`
	Status     tokenReviewStatus `json:"status"`
}

type tokenReviewSpec struct {
	Token     string   `json:"token"`
	Audiences []string `json:"audiences"`
}

type tokenReviewStatus struct {
	Authenticated bool     `json:"authenticated"`
	Audiences     []string `json:"audiences"`
	Error         string   `json:"error"`
	User          struct {
		Username string `json:"username"`
	} `json:"user"`
}

func (v *TokenReviewVerifier) bearer() (string, error) {
	if v.api.Token != "" {
		return v.api.Token, nil
	}
	if v.api.TokenFile != "" {
		b, err := os.ReadFile(v.api.TokenFile)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

func (v *TokenReviewVerifier) ask(ctx context.Context, token string) (Identity, error) {
	body, err := json.Marshal(map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenReview",
		"spec":       tokenReviewSpec{Token: token, Audiences: []string{v.audience}},
	})
	if err != nil {
		return Identity{}, &UnavailableError{err.Error()}
	}
	url := strings.TrimRight(v.api.URL, "/") + "/apis/authentication.k8s.io/v1/tokenreviews"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Identity{}, &UnavailableError{err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	own, err := v.bearer()
	if err != nil {
		return Identity{}, &UnavailableError{"reading this worker's ServiceAccount token: " + err.Error()}
	}
	if own != "" {
		req.Header.Set("Authorization", "Bearer "+own)
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return Identity{}, &UnavailableError{err.Error()}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Identity{}, &UnavailableError{err.Error()}
	}
	if resp.StatusCode/100 != 2 {
		return Identity{}, &UnavailableError{fmt.Sprintf("the API server answered %s: %s", resp.Status, truncate(string(data), 200))}
	}
	var review tokenReview
	if err := json.Unmarshal(data, &review); err != nil {
		return Identity{}, &UnavailableError{"decoding the TokenReview: " + err.Error()}
	}
	st := review.Status
	if !st.Authenticated {
		reason := st.Error
		if reason == "" {
			reason = "not authenticated"
		}
		return Identity{}, &UnauthenticatedError{reason}
	}
	// The API server returns the audiences the token is valid for among those asked.
	found := false
	for _, a := range st.Audiences {
		found = found || a == v.audience
	}
	if !found {
		return Identity{}, &UnauthenticatedError{fmt.Sprintf("token is not for audience %q", v.audience)}
	}
	if st.User.Username == "" {
		return Identity{}, &UnauthenticatedError{"review names no user"}
	}
	return Identity{Username: st.User.Username}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
