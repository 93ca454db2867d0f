package main

import (
	"testing"

	bp "github.com/backpressure-dev/backpressure-operator/sdk/go"
)

func TestClassifyMatchesTheRustLabWorker(t *testing.T) {
	for status, want := range map[int]bp.Outcome{
		200: bp.Success, 204: bp.Success, 0: bp.DependencyFailure, 429: bp.DependencyFailure,
		503: bp.DependencyFailure, 500: bp.DependencyFailure, 400: bp.MessageFailure, 404: bp.MessageFailure,
	} {
		if got := classify(status); got != want {
			t.Errorf("classify(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestParseDeliveriesReadsTheFetchScriptsAnswer(t *testing.T) {
	reply := []any{
		[]any{"1-0", int64(1), []any{"body", "m1"}},
		[]any{"2-0", int64(3), []any{"other", "x", "body", "m2"}},
	}
	got, err := parseDeliveries(reply)
	if err != nil {
		t.Fatal(err)
	}
	want := []delivery{{id: "1-0", deliveries: 1, body: "m1"}, {id: "2-0", deliveries: 3, body: "m2"}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("delivery %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parseDeliveries([]any{[]any{"1-0", "one"}}); err == nil {
		t.Error("a malformed entry was accepted")
	}
	if _, err := parseDeliveries("OK"); err == nil {
		t.Error("a non-list reply was accepted")
	}
}

// The values are the lab's Rust fold (`consumer.bytes().fold(seed, ...)`) run on the same
// inputs; the first by hand: (1*31 + 'a') * 31 + 'b' = 128*31 + 98 = 4066. The last one wraps
// around 2^64.
func TestPodSeedIsTheLabsFoldOfTheConsumerName(t *testing.T) {
	for _, c := range []struct {
		seed     uint64
		consumer string
		want     uint64
	}{
		{7, "", 7},
		{1, "ab", 4066},
		{42, "worker-0", 39197303220171},
		{42, "worker-1", 39197303220172},
		{^uint64(0), "export-worker-7f9c4d5b8-x2k9q", 7277191623930247209},
	} {
		if got := podSeed(c.seed, c.consumer); got != c.want {
			t.Errorf("podSeed(%d, %q) = %d, want %d", c.seed, c.consumer, got, c.want)
		}
	}
}
