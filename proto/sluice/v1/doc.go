// Package sluicev1 holds the generated Go code of Sluice's gRPC API,
// sluice.v1.RateLimiter (see sluice.proto). Do not edit the .pb.go files;
// regenerate them with `go generate ./proto/...`, which needs protoc,
// protoc-gen-go and protoc-gen-go-grpc on PATH.
package sluicev1

//go:generate protoc --proto_path=../.. --go_out=../.. --go_opt=paths=source_relative --go-grpc_out=../.. --go-grpc_opt=paths=source_relative sluice/v1/sluice.proto
