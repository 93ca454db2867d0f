package backpressure

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fieldOf(err error) string {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

func TestDefaultRoundTripsAndValidates(t *testing.T) {
	cfg := DefaultWorkerConfig()
	if len(cfg.Hash) != 12 {
		t.Fatal(cfg.Hash)
	}
	got, err := ParseWorkerConfig(mustJSON(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if got.Hash != cfg.Hash || got.SetPoint != cfg.SetPoint || got.MaxPermits != cfg.MaxPermits {
		t.Fatalf("%+v", got)
	}
	text := string(mustJSON(t, cfg))
	if strings.Contains(text, "initialPermits") || strings.Contains(text, "redelivery") {
		t.Fatalf("optional fields written: %s", text)
	}
}

func TestHashChangesWithContentAndNotWithGeneration(t *testing.T) {
	a := DefaultWorkerConfig()
	b := a
	b.SetPoint = 0.1
	b = b.WithHash()
	if a.Hash == b.Hash {
		t.Fatal("same hash")
	}
	later := a
	later.Generation = 99
	if err := later.Validate(); err != nil {
		t.Fatal(err)
	}
	tampered := a
	tampered.MaxPermits++
	var he *HashError
	if !errors.As(tampered.Validate(), &he) {
		t.Fatal("tampering not detected")
	}
}

func TestJCSCanonicalForm(t *testing.T) {
	cfg := DefaultWorkerConfig()
	cfg.Hash = ""
	cfg.Brake = &BrakeConfig{MinBackoff: 1, ExpiresAtUnix: ptr(int64(1_700_000_000))}
	cfg.FloorMax = ptr(0.0)
	got, err := cfg.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"algorithm":"SetPoint","brake":{"expiresAtUnix":1700000000,"minBackoff":1},"floorMax":0,` +
		`"generation":0,"hash":"","maxPermits":16,"probeInitialMs":2000,"probeMaxMs":60000,` +
		`"reaction":20,"setPoint":0.05,"version":"backpressure.dev/worker-config/v1"}`
	if got != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
	// RFC 8785 appendix B's numbers.
	for bits, want := range map[uint64]string{
		0x0000000000000000: "0",
		0x8000000000000000: "0",
		0x0000000000000001: "5e-324",
		0x8000000000000001: "-5e-324",
		0x7fefffffffffffff: "1.7976931348623157e+308",
		0x4340000000000000: "9007199254740992",
		0xc340000000000000: "-9007199254740992",
		0x4430000000000000: "295147905179352830000",
		0x44b52d02c7e14af5: "9.999999999999997e+22",
		0x44b52d02c7e14af6: "1e+23",
		0x44b52d02c7e14af7: "1.0000000000000001e+23",
		0x444b1ae4d6e2ef4e: "999999999999999700000",
		0x444b1ae4d6e2ef50: "1e+21",
		0x3eb0c6f7a0b5ed8c: "9.999999999999997e-7",
		0x3eb0c6f7a0b5ed8d: "0.000001",
		0x41b3de4355555553: "333333333.3333332",
		0x41b3de4355555554: "333333333.33333325",
		0x41b3de4355555556: "333333333.3333334",
		0x41b3de4355555557: "333333333.33333343",
		0xc1b3de4355555557: "-333333333.33333343",
		0x444b1ae4d6e2ef4f: "999999999999999900000",
	} {
		if got, _ := JCSNumber(math.Float64frombits(bits)); got != want {
			t.Errorf("%#x: %s, want %s", bits, got, want)
		}
	}
	if _, err := JCSNumber(math.NaN()); err == nil {
		t.Fatal("NaN formatted")
	}
	if jsonString("a\"\\\u0001\n/\u2028é") != `"a\"\\\u0001\n/`+"\u2028"+`é"` {
		t.Fatal(jsonString("a\"\\\u0001\n/\u2028é"))
	}
	// A surrogate pair (U+1F600: D83D) sorts before U+FB33 in UTF-16, after it in code points.
	if !utf16Less("\U0001F600", "\uFB33") {
		t.Fatal("not UTF-16 order")
	}
}

func TestRejectsWithFieldNames(t *testing.T) {
	base := DefaultWorkerConfig()
	base.Hash = ""
	cases := []struct {
		mut   func(*WorkerConfig)
		field string
	}{
		{func(c *WorkerConfig) { c.SetPoint = 1.5 }, "setPoint"},
		{func(c *WorkerConfig) { c.SetPoint = math.NaN() }, "setPoint"},
		{func(c *WorkerConfig) { c.Reaction = 0 }, "reaction"},
		{func(c *WorkerConfig) { c.MaxPermits = 0 }, "maxPermits"},
		{func(c *WorkerConfig) { c.ProbeInitialMs = 0 }, "probeInitialMs"},
		{func(c *WorkerConfig) { c.ProbeMaxMs = 1 }, "probeMaxMs"},
		{func(c *WorkerConfig) { c.Generation = -1 }, "generation"},
		{func(c *WorkerConfig) { c.RatioWindowMs = ptr(uint64(0)) }, "ratioWindowMs"},
		{func(c *WorkerConfig) { c.FloorMax = ptr(0.95) }, "floorMax"},
		{func(c *WorkerConfig) { c.FloorMax = ptr(math.NaN()) }, "floorMax"},
		{func(c *WorkerConfig) { c.Redelivery = &RedeliveryConfig{BaseMs: 10, MaxMs: 5} }, "redelivery.maxMs"},
		{func(c *WorkerConfig) { c.Brake = &BrakeConfig{MinBackoff: 2} }, "brake.minBackoff"},
	}
	for _, tc := range cases {
		c := base
		tc.mut(&c)
		err := c.Validate()
		if fieldOf(err) != tc.field || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v", tc.field, err)
		}
	}
	v := base
	v.Version = "nope"
	var ve *VersionError
	if !errors.As(v.Validate(), &ve) {
		t.Fatal("version")
	}
	ok := base
	ok.InitialPermits, ok.RatioWindowMs, ok.BrakeReleaseMs = ptr(uint32(0)), ptr(uint64(1)), ptr(uint64(0))
	ok.FloorMax, ok.Redelivery = ptr(0.0), &RedeliveryConfig{}
	ok = ok.WithHash()
	got, err := ParseWorkerConfig(mustJSON(t, ok))
	if err != nil || got.Hash != ok.Hash || *got.InitialPermits != 0 || got.Redelivery == nil {
		t.Fatalf("%v %+v", err, got)
	}
}

// Payload shapes refused as malformed, as serde_json refuses them (deny_unknown_fields,
// case-sensitive names, duplicates, missing fields, wrong types, integers written as floats).
func TestMalformedPayloads(t *testing.T) {
	good := string(mustJSON(t, DefaultWorkerConfig()))
	replace := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("%s not in %s", old, good)
		}
		return strings.Replace(good, old, new, 1)
	}
	cases := map[string]string{
		"not json":       "{not json",
		"array":          "[]",
		"unknown":        replace(`"reaction":20`, `"reaction":20,"surprise":1`),
		"case":           replace(`"setPoint"`, `"setpoint"`),
		"duplicate":      replace(`"reaction":20`, `"reaction":20,"reaction":20`),
		"missing":        replace(`"reaction":20,`, ``),
		"null required":  replace(`"reaction":20`, `"reaction":null`),
		"float integer":  replace(`"reaction":20`, `"reaction":20.0`),
		"exp integer":    replace(`"reaction":20`, `"reaction":2e1`),
		"negative u32":   replace(`"reaction":20`, `"reaction":-1`),
		"minus zero":     replace(`"generation":0`, `"generation":-0`),
		"u32 overflow":   replace(`"reaction":20`, `"reaction":4294967296`),
		"string number":  replace(`"reaction":20`, `"reaction":"20"`),
		"bad algorithm":  replace(`"SetPoint"`, `"setpoint"`),
		"trailing":       good + "x",
		"float range":    replace(`"setPoint":0.05`, `"setPoint":1e400`),
		"brake unknown":  replace(`"reaction":20`, `"reaction":20,"brake":{"minBackoff":0.5,"x":1}`),
		"brake missing":  replace(`"reaction":20`, `"reaction":20,"brake":{}`),
		"hash null":      replace(`"hash":"`+DefaultWorkerConfig().Hash+`"`, `"hash":null`),
		"invalid utf8":   replace(`"hash":"`, "\"hash\":\"\xff"),
		"redelivery str": replace(`"reaction":20`, `"reaction":20,"redelivery":"x"`),
	}
	for name, body := range cases {
		_, err := ParseWorkerConfig([]byte(body))
		var me *MalformedError
		if !errors.As(err, &me) || !strings.HasPrefix(err.Error(), "malformed document") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Optional fields may be null (absent), integers may be written as f64 fields.
	body := replace(`"reaction":20`, `"reaction":20,"brake":null,"initialPermits":null`)
	body = strings.Replace(body, `"hash":"`+DefaultWorkerConfig().Hash+`"`, `"hash":""`, 1)
	body = strings.Replace(body, `"setPoint":0.05`, `"setPoint":5e-2`, 1)
	cfg, err := ParseWorkerConfig([]byte(body))
	if err != nil || cfg.Brake != nil || cfg.InitialPermits != nil || cfg.SetPoint != 0.05 {
		t.Fatalf("%v %+v", err, cfg)
	}
	// hash is optional (serde default).
	noHash := strings.Replace(good, `"hash":"`+DefaultWorkerConfig().Hash+`",`, ``, 1)
	if _, err := ParseWorkerConfig([]byte(noHash)); err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat(" ", MaxPayloadBytes+1))
	var tl *TooLargeError
	if _, err := ParseWorkerConfig(big); !errors.As(err, &tl) {
		t.Fatal(err)
	}
}

func TestBrakeExpires(t *testing.T) {
	cfg := DefaultWorkerConfig()
	cfg.Brake = &BrakeConfig{MinBackoff: 0.5, ExpiresAtUnix: ptr(int64(100))}
	if v, ok := cfg.ActiveBrake(99); !ok || v != 0.5 {
		t.Fatal("active")
	}
	if _, ok := cfg.ActiveBrake(100); ok {
		t.Fatal("expired")
	}
}
