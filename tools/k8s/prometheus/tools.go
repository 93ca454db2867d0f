//go:build tools

// Package tools pins Prometheus' main packages for `go mod tidy`.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
