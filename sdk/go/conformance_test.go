package backpressure

// The conformance executor on its own (pure) and the hook through the admin handler. The
// executor is checked against every golden vector in vectors_test.go.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// testCase is a case around steps (a JSON array) with the default payload.
func testCase(t *testing.T, steps string) []byte {
	t.Helper()
	return fmt.Appendf(nil, `{"name": "n", "description": "d", "seed": 7, "brakeOffsetNs": 0, "config": %s, "steps": %s}`,
		mustJSON(t, DefaultWorkerConfig()), steps)
}

func TestACaseRunsOnAFreshControllerStepByStep(t *testing.T) {
	// The library's own doc example: a fresh controller starts at 2 permits and 40
	// dependency failures back it off fully.
	steps := []string{`{"t": 1000000000, "op": "permits", "inFlight": 0, "expect": {}}`}
	for range 40 {
		steps = append(steps, `{"t": 1000000000, "op": "record", "outcome": "dependency_failure"}`)
	}
	steps = append(steps, `{"t": 1000000000, "op": "permits", "inFlight": 0}`)
	out, err := RunConformanceCase(testCase(t, "["+strings.Join(steps, ",")+"]"))
	if err != nil {
		t.Fatal(err)
	}
	obs := out.Observations
	if len(obs) != 42 {
		t.Fatalf("%d observations", len(obs))
	}
	if obs[0].Permits == nil || *obs[0].Permits != 2 || obs[0].Mode != "starting" {
		t.Fatalf("first step %+v", obs[0])
	}
	if obs[1].Permits != nil {
		t.Fatal("permits on a record step")
	}
	if obs[41].Backoff != 1 || obs[41].Permits == nil || *obs[41].Permits != 0 {
		t.Fatalf("last step %+v", obs[41])
	}
	var doc struct {
		Observations []map[string]json.RawMessage `json:"observations"`
	}
	if err := json.Unmarshal(mustJSON(t, out), &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.Observations[1]["permits"]; ok {
		t.Fatal("permits written on a record step")
	}
	if string(doc.Observations[1]["floorEstimate"]) != "null" {
		t.Fatalf("floorEstimate %s, want null", doc.Observations[1]["floorEstimate"])
	}
	for _, k := range []string{"backoff", "mode", "limit", "failureFloor"} {
		if _, ok := doc.Observations[0][k]; !ok {
			t.Fatalf("no %s in %v", k, doc.Observations[0])
		}
	}
}

func TestConfigureStepsCarryTheBrakeAndTheAlgorithm(t *testing.T) {
	braked := DefaultWorkerConfig()
	braked.Hash = ""
	braked.Brake = &BrakeConfig{MinBackoff: 1}
	fixed := DefaultWorkerConfig()
	fixed.Hash = ""
	fixed.Algorithm = AlgorithmFixed
	out, err := RunConformanceCase(testCase(t, fmt.Sprintf(`[
		{"t": 5000000000, "op": "configure", "config": %s, "unixS": 1000},
		{"t": 5000000000, "op": "permits", "inFlight": 0},
		{"t": 6000000000, "op": "configure", "config": %s, "unixS": 1001},
		{"t": 6000000000, "op": "releaseUnused", "unused": 0}
	]`, mustJSON(t, braked), mustJSON(t, fixed))))
	if err != nil {
		t.Fatal(err)
	}
	obs := out.Observations
	if obs[1].Limit != 0 || *obs[1].Permits != 0 || obs[1].Backoff != 1 {
		t.Fatalf("a full brake lets nothing through: %+v", obs[1])
	}
	// The brake is lifted over brakeRelease (60 s), so Fixed still runs under it at 6 s.
	if obs[3].Limit != 0 || obs[3].Mode != "normal" {
		t.Fatalf("after the algorithm change under the lifting brake: %+v", obs[3])
	}
}

func TestBadCasesAreRefusedWithTheReason(t *testing.T) {
	cfg := string(mustJSON(t, DefaultWorkerConfig()))
	bad := DefaultWorkerConfig()
	bad.Hash, bad.SetPoint = "", 2
	for name, tc := range map[string]struct {
		body, says string
		step       int
	}{
		"not json":         {`{"seed": 1,`, "malformed case: EOF while parsing", -1},
		"not an object":    {`[1, 2]`, "malformed case", -1},
		"trailing":         {string(testCase(t, "[]")) + " {}", "trailing", -1},
		"missing seed":     {`{"brakeOffsetNs": 0, "config": ` + cfg + `, "steps": []}`, "missing field `seed`", -1},
		"negative seed":    {`{"seed": -1, "brakeOffsetNs": 0, "config": ` + cfg + `, "steps": []}`, "seed", -1},
		"steps not a list": {`{"seed": 1, "brakeOffsetNs": 0, "config": ` + cfg + `, "steps": {}}`, "steps", -1},
		"config not a payload": {`{"seed": 1, "brakeOffsetNs": 0, "config": {"setPoint": 0.1}, "steps": []}`,
			"config", -1},
		"unknown op":        {string(testCase(t, `[{"t": 1, "op": "explode"}]`)), "explode", 0},
		"op case":           {string(testCase(t, `[{"t": 1, "OP": "record", "outcome": "success"}]`)), "missing field `op`", 0},
		"unknown outcome":   {string(testCase(t, `[{"t": 1, "op": "record", "outcome": "timeout"}]`)), "timeout", 0},
		"permits without":   {string(testCase(t, `[{"t": 1, "op": "record", "outcome": "success"}, {"t": 1, "op": "permits"}]`)), "inFlight", 1},
		"float time":        {string(testCase(t, `[{"t": 1.5, "op": "record", "outcome": "success"}]`)), "`t`", 0},
		"configure no unix": {string(testCase(t, `[{"t": 1, "op": "configure", "config": `+cfg+`}]`)), "unixS", 0},
		"invalid config": {`{"seed": 1, "brakeOffsetNs": 0, "config": ` + string(mustJSON(t, bad)) + `, "steps": []}`,
			"invalid config in config: invalid worker config field setPoint", -1},
		"invalid step config": {string(testCase(t, `[{"t": 1, "op": "configure", "unixS": 0, "config": `+string(mustJSON(t, bad))+`}]`)),
			"invalid config in steps[0].config: invalid worker config field setPoint", 0},
		"back in time": {string(testCase(t, `[{"t": 2, "op": "record", "outcome": "success"}, {"t": 1, "op": "record", "outcome": "success"}]`)),
			"steps[1]: t goes back in time", 1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := RunConformanceCase([]byte(tc.body))
			var ce *CaseError
			if !errors.As(err, &ce) {
				t.Fatalf("%v is not a CaseError", err)
			}
			if !strings.Contains(err.Error(), tc.says) || ce.Step != tc.step {
				t.Fatalf("error %q (step %d), want it to say %q at step %d", err, ce.Step, tc.says, tc.step)
			}
		})
	}
	// An invalid payload keeps its kind for errors.As.
	_, err := RunConformanceCase([]byte(`{"seed": 1, "brakeOffsetNs": 0, "config": ` + string(mustJSON(t, bad)) + `, "steps": []}`))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "setPoint" {
		t.Fatalf("%v", err)
	}
	// Too many steps, before anything runs.
	c := ConformanceCase{Config: DefaultWorkerConfig(), Steps: make([]ConformanceStep, MaxConformanceSteps+1)}
	if _, err := c.Run(); err == nil || !strings.Contains(err.Error(), "exceed the limit") {
		t.Fatalf("%v", err)
	}
}

// hookCall posts body to the hook of a (with Content-Length unless chunked).
func hookCall(a *Admin, method string, body []byte, chunked bool) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, ConformanceHookPath, bytes.NewReader(body))
	r.RemoteAddr = "192.0.2.1:1234"
	if chunked {
		r.ContentLength = -1
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	return w
}

func errorBody(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var e struct {
		Error *string `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error == nil || *e.Error == "" {
		t.Fatalf("%d answer without an error: %q", w.Code, w.Body.String())
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	return *e.Error
}

func TestTheHookIsOffByDefault(t *testing.T) {
	a, _ := newAdmin(t)
	w := hookCall(a, http.MethodPost, testCase(t, "[]"), false)
	if w.Code != http.StatusNotFound {
		t.Fatalf("hook off: %d %s", w.Code, w.Body.String())
	}
	errorBody(t, w)
}

// Every case of the golden vectors, posted to the hook as it is in the file, is answered
// with the readings the case expects; the controller serving messages is untouched and no
// token is needed.
func TestTheHookReproducesTheGoldenVectors(t *testing.T) {
	a, gate := newAdmin(t)
	a.WithConformanceHook()
	before, ack := gate.Snapshot(), a.State().Ack()
	var v controllerVectors
	if err := json.Unmarshal(readVectors(t, "controller.json"), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, raw := range v.Cases {
		var e vectorExpectations
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		w := hookCall(a, http.MethodPost, raw, false)
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("case %s: %d %s", e.Name, w.Code, w.Body.String())
		}
		var doc struct {
			Observations []map[string]json.RawMessage `json:"observations"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || len(doc.Observations) != len(e.Steps) {
			t.Fatalf("case %s: %v, %d observations", e.Name, err, len(doc.Observations))
		}
		for i, o := range doc.Observations {
			_, has := o["permits"]
			_, hasFloor := o["floorEstimate"]
			if has != (e.Steps[i].Op == string(OpPermits)) || !hasFloor || len(o) != 5+map[bool]int{true: 1}[has] {
				t.Fatalf("case %s, step %d: fields %v", e.Name, i, o)
			}
		}
		var out Observations
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		checkObservations(t, v.Tolerance, out, e)
	}
	if after := gate.Snapshot(); after != before || a.State().Ack() != ack {
		t.Fatalf("the hook touched the worker: %+v -> %+v", before, after)
	}
}

func TestTheHookRefusesWhatIsNotACase(t *testing.T) {
	a, _ := newAdmin(t)
	a.WithConformanceHook()
	bad := DefaultWorkerConfig()
	bad.Hash, bad.MaxPermits = "", 0
	for name, body := range map[string]string{
		"bad json":       `{"seed": `,
		"unknown op":     string(testCase(t, `[{"t": 1, "op": "explode"}]`)),
		"invalid config": `{"seed": 1, "brakeOffsetNs": 0, "config": ` + string(mustJSON(t, bad)) + `, "steps": []}`,
		"back in time":   string(testCase(t, `[{"t": 2, "op": "record", "outcome": "success"}, {"t": 1, "op": "record", "outcome": "success"}]`)),
	} {
		w := hookCall(a, http.MethodPost, []byte(body), false)
		if w.Code != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", name, w.Code, w.Body.String())
		}
		t.Logf("%s: %s", name, errorBody(t, w))
	}
	// Above 16 MiB: 413, whether the length is announced or not.
	big := append(testCase(t, "[]"), bytes.Repeat([]byte(" "), MaxConformanceCaseBytes)...)
	for _, chunked := range []bool{false, true} {
		w := hookCall(a, http.MethodPost, big, chunked)
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked %v: %d %s", chunked, w.Code, w.Body.String())
		}
		errorBody(t, w)
	}
	// Exactly at the limit it is read (and runs).
	limit := testCase(t, "[]")
	limit = append(limit, bytes.Repeat([]byte(" "), MaxConformanceCaseBytes-len(limit))...)
	if w := hookCall(a, http.MethodPost, limit, true); w.Code != http.StatusOK || w.Body.String() != `{"observations":[]}` {
		t.Fatalf("at the limit: %d %s", w.Code, w.Body.String())
	}
	// Only POST.
	if w := hookCall(a, http.MethodGet, nil, false); w.Code != http.StatusNotFound {
		t.Fatalf("GET: %d", w.Code)
	}
}
