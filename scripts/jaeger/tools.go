//go:build tools

// Package tools names the command this module builds, so `go mod tidy` keeps what it imports.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
