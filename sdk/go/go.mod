module github.com/backpressure-dev/backpressure-operator/sdk/go

go 1.26
