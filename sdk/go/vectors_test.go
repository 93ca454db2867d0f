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

type vectorStep struct {
	T        uint64          `json:"t"`
	Op       string          `json:"op"`
	Outcome  string          `json:"outcome"`
	InFlight *uint32         `json:"inFlight"`
	Unused   *uint32         `json:"unused"`
	Config   json.RawMessage `json:"config"`
	UnixS    *int64          `json:"unixS"`
	Expect   vectorExpect    `json:"expect"`
}

type vectorCase struct {
	Name          string          `json:"name"`
	Description   string          `json:"description"`
	Seed          uint64          `json:"seed"`
	BrakeOffsetNs uint64          `json:"brakeOffsetNs"`
	Config        json.RawMessage `json:"config"`
	Steps         []vectorStep    `json:"steps"`
}

type controllerVectors struct {
	Format    string       `json:"format"`
	Tolerance float64      `json:"tolerance"`
	Cases     []vectorCase `json:"cases"`
}

// vectorWorker applies configurations as a worker does (Gate.Apply): the brake converted to
// controller time, succeeding the old one with this worker's offset, then ApplySettings.
type vectorWorker struct {
	c      Controller
	brake  *Brake
	seed   uint64
	offset Nanos
}

func (w *vectorWorker) configure(now Nanos, cfg *WorkerConfig, unixS int64) {
	settings := SettingsFromConfig(cfg)
	var next *Brake
	if cfg.Brake != nil {
		b := BrakeFromWire(cfg.Brake, now, unixS)
		next = &b
	}
	old := w.brake
	w.brake = nil
	if b, ok := SucceedBrake(old, next, now, settings.BrakeRelease, w.offset); ok {
		w.brake = &b
	}
	ApplySettings(&w.c, now, settings, w.seed, w.brake)
}

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
	for _, c := range v.Cases {
		steps += len(c.Steps)
		t.Run(c.Name, func(t *testing.T) { runVectorCase(t, v.Tolerance, c) })
	}
	t.Logf("%d cases, %d steps", len(v.Cases), steps)
}

func runVectorCase(t *testing.T, tolerance float64, c vectorCase) {
	cfg, err := decodeWorkerConfig(c.Config)
	if err != nil {
		t.Fatalf("case %s: config: %v", c.Name, err)
	}
	w := &vectorWorker{c: FromConfig(&cfg, c.Seed), seed: c.Seed, offset: Nanos(c.BrakeOffsetNs)}
	if cfg.Brake != nil {
		t.Fatalf("case %s: the initial config carries a brake (it comes with a configure step)", c.Name)
	}
	for i, s := range c.Steps {
		now := Nanos(s.T)
		fail := func(format string, args ...any) {
			t.Fatalf("case %s, step %d (t=%d, op=%s): %s", c.Name, i, s.T, s.Op, fmt.Sprintf(format, args...))
		}
		var permits *uint32
		switch s.Op {
		case "record":
			o, err := ParseOutcome(s.Outcome)
			if err != nil {
				fail("%v", err)
			}
			w.c.Record(now, o)
		case "permits":
			if s.InFlight == nil {
				fail("no inFlight")
			}
			p := w.c.Permits(now, *s.InFlight)
			permits = &p
		case "releaseUnused":
			if s.Unused == nil {
				fail("no unused")
			}
			w.c.ReleaseUnused(now, *s.Unused)
		case "configure":
			next, err := decodeWorkerConfig(s.Config)
			if err != nil {
				fail("config: %v", err)
			}
			if s.UnixS == nil {
				fail("no unixS")
			}
			w.configure(now, &next, *s.UnixS)
		default:
			fail("unknown op")
		}
		e := s.Expect
		if e.Permits != nil {
			if permits == nil {
				fail("expects permits on a step that is not a permits call")
			}
			if *permits != *e.Permits {
				fail("permits %d, expected %d", *permits, *e.Permits)
			}
		}
		if e.Backoff != nil {
			if got := w.c.Backoff(now); !(math.Abs(got-*e.Backoff) <= tolerance) {
				fail("backoff %v, expected %v", got, *e.Backoff)
			}
		}
		if e.Mode != nil && w.c.Mode().String() != *e.Mode {
			fail("mode %s, expected %s", w.c.Mode(), *e.Mode)
		}
		if e.Limit != nil && w.c.Limit(now) != *e.Limit {
			fail("limit %d, expected %d", w.c.Limit(now), *e.Limit)
		}
		if e.FailureFloor != nil {
			if got := w.c.FailureFloor(); !(math.Abs(got-*e.FailureFloor) <= tolerance) {
				fail("failureFloor %v, expected %v", got, *e.FailureFloor)
			}
		}
		if len(e.FloorEstimate) > 0 {
			got, known := w.c.FloorEstimate()
			if string(bytes.TrimSpace(e.FloorEstimate)) == "null" {
				if known {
					fail("floorEstimate %v, expected null", got)
				}
			} else {
				var want float64
				if err := json.Unmarshal(e.FloorEstimate, &want); err != nil {
					fail("floorEstimate: %v", err)
				}
				if !known || !(math.Abs(got-want) <= tolerance) {
					fail("floorEstimate %v (known %v), expected %v", got, known, want)
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
