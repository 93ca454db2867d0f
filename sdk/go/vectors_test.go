package backpressure

// The golden vectors (conformance/vectors/, format in conformance/README.md), generated from
// the Rust implementation. A missing file is a failure, not a skip. BP_VECTORS_go overrides
// the directory.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func vectorsDir() string {
	if d := os.Getenv("BP_VECTORS_go"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "conformance", "vectors")
}

func readVectors(t *testing.T, name string) []byte {
	t.Helper()
	path := filepath.Join(vectorsDir(), name)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden vectors %s: %v (set BP_VECTORS_go to the directory holding them)", path, err)
	}
	return data
}

type vectorExpect struct {
	Permits       *uint32         `json:"permits"`
	Backoff       *float64        `json:"backoff"`
	Mode          *string         `json:"mode"`
	Limit         *uint32         `json:"limit"`
	FailureFloor  *float64        `json:"failureFloor"`
	FloorEstimate json.RawMessage `json:"floorEstimate"`
}

// vectorExpectations is what a case of the file expects; the case itself runs through the
// conformance executor (conformance.go), exactly as the hook runs it.
type vectorExpectations struct {
	Name  string `json:"name"`
	Steps []struct {
		T      uint64       `json:"t"`
		Op     string       `json:"op"`
		Expect vectorExpect `json:"expect"`
	} `json:"steps"`
}

type controllerVectors struct {
	Format    string            `json:"format"`
	Tolerance float64           `json:"tolerance"`
	Cases     []json.RawMessage `json:"cases"`
}

// TestGoldenControllerVectors runs every case of controller.json through the conformance
// executor (the hook's) and compares every reading with the case's expect.
func TestGoldenControllerVectors(t *testing.T) {
	var v controllerVectors
	if err := json.Unmarshal(readVectors(t, "controller.json"), &v); err != nil {
		t.Fatalf("controller.json: %v", err)
	}
	if v.Format != "backpressure.dev/controller-vectors/v1" {
		t.Fatalf("controller.json: format %q", v.Format)
	}
	if len(v.Cases) == 0 {
		t.Fatal("controller.json has no cases")
	}
	steps := 0
	for i, raw := range v.Cases {
		var e vectorExpectations
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("cases[%d]: %v", i, err)
		}
		steps += len(e.Steps)
		t.Run(e.Name, func(t *testing.T) { runVectorCase(t, v.Tolerance, raw, e) })
	}
	t.Logf("%d cases, %d steps", len(v.Cases), steps)
}

func runVectorCase(t *testing.T, tolerance float64, raw json.RawMessage, e vectorExpectations) {
	c, err := ParseConformanceCase(raw)
	if err != nil {
		t.Fatalf("case %s: %v", e.Name, err)
	}
	if c.Config.Brake != nil {
		t.Fatalf("case %s: the initial config carries a brake (it comes with a configure step)", e.Name)
	}
	out, err := c.Run()
	if err != nil {
		t.Fatalf("case %s: %v", e.Name, err)
	}
	checkObservations(t, tolerance, out, e)
}

// checkObservations compares the readings of a case with its expect, step by step.
func checkObservations(t *testing.T, tolerance float64, out Observations, e vectorExpectations) {
	t.Helper()
	if len(out.Observations) != len(e.Steps) {
		t.Fatalf("case %s: %d observations for %d steps", e.Name, len(out.Observations), len(e.Steps))
	}
	for i, s := range e.Steps {
		o := out.Observations[i]
		fail := func(format string, args ...any) {
			t.Fatalf("case %s, step %d (t=%d, op=%s): %s", e.Name, i, s.T, s.Op, fmt.Sprintf(format, args...))
		}
		if (o.Permits != nil) != (s.Op == string(OpPermits)) {
			fail("permits reported: %v", o.Permits != nil)
		}
		want := s.Expect
		if want.Permits != nil {
			if o.Permits == nil {
				fail("expects permits on a step that is not a permits call")
			}
			if *o.Permits != *want.Permits {
				fail("permits %d, expected %d", *o.Permits, *want.Permits)
			}
		}
		if want.Backoff != nil && !(math.Abs(o.Backoff-*want.Backoff) <= tolerance) {
			fail("backoff %v, expected %v", o.Backoff, *want.Backoff)
		}
		if want.Mode != nil && o.Mode != *want.Mode {
			fail("mode %s, expected %s", o.Mode, *want.Mode)
		}
		if want.Limit != nil && o.Limit != *want.Limit {
			fail("limit %d, expected %d", o.Limit, *want.Limit)
		}
		if want.FailureFloor != nil && !(math.Abs(o.FailureFloor-*want.FailureFloor) <= tolerance) {
			fail("failureFloor %v, expected %v", o.FailureFloor, *want.FailureFloor)
		}
		if len(want.FloorEstimate) > 0 {
			if string(bytes.TrimSpace(want.FloorEstimate)) == "null" {
				if o.FloorEstimate != nil {
					fail("floorEstimate %v, expected null", *o.FloorEstimate)
				}
			} else {
				var w float64
				if err := json.Unmarshal(want.FloorEstimate, &w); err != nil {
					fail("floorEstimate: %v", err)
				}
				if o.FloorEstimate == nil {
					fail("floorEstimate null, expected %v", w)
				}
				if !(math.Abs(*o.FloorEstimate-w) <= tolerance) {
					fail("floorEstimate %v, expected %v", *o.FloorEstimate, w)
				}
			}
		}
	}
}

type hashCase struct {
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload"`
	JCS     string          `json:"jcs"`
	Hash    string          `json:"hash"`
}

// TestGoldenHashVectors: every worker payload parses (its hash checked), canonicalizes to the
// expected JCS text and hashes to the expected hash; the other documents (the producer
// state, whose gate this SDK does not implement) are checked through the generic JCS form.
func TestGoldenHashVectors(t *testing.T) {
	var v struct {
		Format string     `json:"format"`
		Cases  []hashCase `json:"cases"`
	}
	if err := json.Unmarshal(readVectors(t, "hash.json"), &v); err != nil {
		t.Fatalf("hash.json: %v", err)
	}
	if v.Format != "backpressure.dev/hash-vectors/v1" {
		t.Fatalf("hash.json: format %q", v.Format)
	}
	if len(v.Cases) == 0 {
		t.Fatal("hash.json has no cases")
	}
	workers := 0
	for _, c := range v.Cases {
		t.Run(c.Name, func(t *testing.T) {
			var head struct {
				Version string `json:"version"`
			}
			if err := json.Unmarshal(c.Payload, &head); err != nil {
				t.Fatalf("case %s: %v", c.Name, err)
			}
			if head.Version != WireVersion {
				// Another document: the hash is SHA-256 over the JCS form with hash "" and
				// generation 0.
				var doc map[string]any
				dec := json.NewDecoder(bytes.NewReader(c.Payload))
				dec.UseNumber()
				if err := dec.Decode(&doc); err != nil {
					t.Fatalf("case %s: %v", c.Name, err)
				}
				doc["hash"], doc["generation"] = "", json.Number("0")
				cleared, _ := json.Marshal(doc)
				got, err := CanonicalJSON(cleared)
				if err != nil || got != c.JCS {
					t.Fatalf("case %s: JCS\n got %s (%v)\nwant %s", c.Name, got, err, c.JCS)
				}
				return
			}
			workers++
			cfg, err := ParseWorkerConfig(c.Payload)
			if err != nil {
				t.Fatalf("case %s: parse: %v", c.Name, err)
			}
			if cfg.Hash != c.Hash {
				t.Fatalf("case %s: payload hash %q, expected %q", c.Name, cfg.Hash, c.Hash)
			}
			cleared := cfg
			cleared.Hash, cleared.Generation = "", 0
			got, err := cleared.Canonical()
			if err != nil || got != c.JCS {
				t.Fatalf("case %s: JCS\n got %s (%v)\nwant %s", c.Name, got, err, c.JCS)
			}
			if generic, err := CanonicalJSON(mustJSON(t, cleared)); err != nil || generic != c.JCS {
				t.Fatalf("case %s: generic JCS %s (%v)", c.Name, generic, err)
			}
			if h := cfg.ComputeHash(); h != c.Hash {
				t.Fatalf("case %s: hash %s, expected %s", c.Name, h, c.Hash)
			}
		})
	}
	if workers == 0 {
		t.Fatal("hash.json has no worker-config case")
	}
}
