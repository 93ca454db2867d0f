//go:build tools

// Package tools pins helm's main package for `go mod tidy`.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
