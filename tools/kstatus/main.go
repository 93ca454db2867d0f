// Command kstatus computes the kstatus status (sigs.k8s.io/cli-utils/pkg/kstatus/status.Compute,
// the library behind `kubectl wait`-style readiness in Flux, kpt and cli-utils appliers) of
// Kubernetes objects.
//
// Input on stdin: a JSON array of objects. Output on stdout: a JSON array with one
// {"status": ..., "message": ...} per object, in order. Exit status 1 on a malformed input or
// when Compute returns an error.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func run(in io.Reader, out io.Writer) error {
	var objects []json.RawMessage
	if err := json.NewDecoder(in).Decode(&objects); err != nil {
		return fmt.Errorf("decode input (a JSON array of objects): %w", err)
	}
	results := make([]result, 0, len(objects))
	for i, raw := range objects {
		// Decoded as client-go decodes API responses (integers stay int64).
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		res, err := status.Compute(u)
		if err != nil {
			return fmt.Errorf("object %d: %w", i, err)
		}
		results = append(results, result{Status: res.Status.String(), Message: res.Message})
	}
	return json.NewEncoder(out).Encode(results)
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
