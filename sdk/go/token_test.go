package backpressure

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

const (
	testAud = "backpressure.dev/shop/export"
	testNow = int64(1_700_000_000)
)

func b64(t *testing.T, v any) string {
	return base64.RawURLEncoding.EncodeToString(mustJSON(t, v))
}

// jwt is a JWT-shaped token with claims (unsigned: the signature part is filler).
func jwt(t *testing.T, claims any) string {
	return b64(t, map[string]string{"alg": "RS256", "kid": "k"}) + "." + b64(t, claims) + ".c2lnbmF0dXJl"
}

type claims map[string]any

func TestLocalCheckAcceptsOurAudienceAndRefusesEverythingElseWithAReason(t *testing.T) {
	for _, c := range []claims{
		{"aud": []string{testAud}, "exp": testNow + 600},
		{"aud": testAud, "exp": testNow + 1},
		{"aud": []string{"x", testAud}, "exp": float64(testNow + 600)},
	} {
		if err := CheckJWT(jwt(t, c), testAud, testNow); err != nil {
			t.Errorf("%v: %v", c, err)
		}
	}
	payload := b64(t, claims{"aud": []string{testAud}, "exp": testNow + 600})
	cases := []struct{ token, why string }{
		{"not-a-jwt", "three"},
		{"a." + payload, "three"},
		{"a." + payload + ".s.d", "three"},
		{payload + "." + payload + ".", "empty signature"},
		{"!!!." + payload + ".s", "header is not base64url"},
		{b64(t, []int{1}) + "." + payload + ".s", "header is not a JSON object"},
		{payload + ".bm90IGpzb24.s", "payload is not JSON"},
		{jwt(t, claims{"aud": []string{testAud}}), "no exp"},
		{jwt(t, claims{"aud": []string{testAud}, "exp": "soon"}), "no exp"},
		{jwt(t, claims{"aud": []string{testAud}, "exp": testNow}), "expired"},
		{jwt(t, claims{"aud": []string{testAud}, "exp": testNow - 3600}), "expired"},
		{jwt(t, claims{"exp": testNow + 600}), "audience"},
		{jwt(t, claims{"aud": []string{"backpressure.dev"}, "exp": testNow + 600}), "audience"},
		{jwt(t, claims{"aud": []string{"backpressure.dev/other/export"}, "exp": testNow + 600}), "audience"},
		{jwt(t, claims{"aud": []string{"backpressure.dev/shop/export-2"}, "exp": testNow + 600}), "audience"},
		{jwt(t, claims{"aud": []int{7}, "exp": testNow + 600}), "audience"},
		{strings.Repeat("a", MaxTokenBytes+1), "longer"},
	}
	for _, c := range cases {
		err := CheckJWT(c.token, testAud, testNow)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%q: %v, want %q", c.why, err, c.why)
			continue
		}
		if strings.Contains(err.Error(), c.token) {
			t.Errorf("the error repeats the token: %v", err)
		}
	}
}

func TestNegativeCacheForgetsAfterItsTTLAndStaysBounded(t *testing.T) {
	clock := time.Unix(testNow, 0)
	c := newNegativeCache(30*time.Second, 4)
	c.now = func() time.Time { return clock }
	key := func(s string) [32]byte { return sha256Sum(s) }
	a := key("a")
	if c.contains(a) {
		t.Fatal("empty cache contains")
	}
	c.insert(a)
	clock = clock.Add(29 * time.Second)
	if !c.contains(a) {
		t.Fatal("forgotten early")
	}
	clock = clock.Add(2 * time.Second)
	if c.contains(a) {
		t.Fatal("kept past its TTL")
	}
	for i := range 100 {
		c.insert(key(fmt.Sprintf("t%d", i)))
		clock = clock.Add(10 * time.Millisecond)
		if c.len() > 4 {
			t.Fatalf("%d entries", c.len())
		}
	}
	if !c.contains(key("t99")) || c.contains(key("t0")) {
		t.Fatal("the newest are kept, the oldest dropped")
	}
	off := newNegativeCache(0, 4)
	off.insert(a)
	if off.contains(a) {
		t.Fatal("a zero TTL caches")
	}
}

func TestVerifierRefusesLocallyWithoutAskingTheAPIServer(t *testing.T) {
	// An address nothing listens on: any review attempt would be a 503, not a 401.
	v, err := NewTokenReviewVerifier(APIServerConfig{URL: "https://127.0.0.1:1", Token: "x"}, "shop", "export")
	if err != nil {
		t.Fatal(err)
	}
	if v.Audience() != testAud {
		t.Fatal(v.Audience())
	}
	_, err = v.Verify(t.Context(), jwt(t, claims{"aud": []string{"backpressure.dev/other/export"}, "exp": time.Now().Unix() + 600}))
	if _, ok := err.(*UnauthenticatedError); !ok {
		t.Fatalf("%T %v", err, err)
	}
	_, err = v.Verify(t.Context(), jwt(t, claims{"aud": []string{testAud}, "exp": time.Now().Unix() + 600}))
	if _, ok := err.(*UnavailableError); !ok {
		t.Fatalf("an unreachable API server is unavailable, not unauthenticated: %T %v", err, err)
	}
}
