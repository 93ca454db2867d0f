//go:build tools

// Package tools pins redis_exporter's main package for `go mod tidy`.
package tools

import (
	_ "github.com/oliver006/redis_exporter"
)
