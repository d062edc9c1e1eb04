# Sluice: run `make run` to serve on the embedded defaults, `make test` to run
# every test (it starts its own Redis servers).

GO      ?= go
GOFLAGS ?=
# The race detector needs cgo, and so a C compiler (gcc or clang): where Go
# finds none (cgo off), the tests run without it and `make test` says so.
RACE = $(if $(filter 1,$(shell $(GO) env CGO_ENABLED 2>/dev/null)),-race)
# CI and `make test` run everything; `make test-short` skips the slow failure tests.
TESTFLAGS ?= $(RACE) -count=1 -timeout 30m

.PHONY: run test test-short vet bench fuzz build image deps rules

# The router adapters are modules of their own, so that Sluice's go.mod does
# not require gin or echo; vet and test run in each.
CONTRIB = contrib/ginlimit contrib/echolimit

# The load generator (package loadgen and the sluice-load binary) lives in
# the bench module; its tests run under the race detector, apart from the
# benchmarks.
LOADGEN = ./loadgen/... ./cmd/...

run:
	$(GO) run ./cmd/sluice serve --grpc-reflection --data-dir .sluice-data

# The build's version, commit and date, as `sluice version`, /healthz and
# sluice_build_info report them.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BUILDINFO = github.com/sluicehq/sluice/internal/buildinfo
LDFLAGS ?= -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).date=$(DATE)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/sluice ./cmd/sluice
	cd bench && $(GO) build -o ../bin/sluice-load ./cmd/sluice-load

# The container image (Dockerfile), with the same version, commit and date;
# see docs/deploy.md.
IMAGE ?= sluice
image:
	docker build -t $(IMAGE) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) --build-arg DATE=$(DATE) .

# The dashboard's test drives headless Chromium (scripts/ensure-chromium.sh
# installs Debian's chromium package when none is found). The fault tests'
# TCP proxy: toxiproxy-server from PATH, or built once from
# internal/tools/toxiproxy into the user's cache directory by this test; the
# cross-region tests' NATS server, built once from internal/tools/nats, so
# that the test processes do not all build it at once.
deps:
	@./scripts/ensure-redis.sh
	@./scripts/ensure-postgres.sh
	@./scripts/ensure-promtool.sh
	@./scripts/ensure-chromium.sh
	$(GO) test -count=1 -run '^TestProxy$$' ./internal/guard/guardtest/
	$(GO) test -count=1 -run '^TestBuild$$' ./internal/testbin/

vet:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	@for m in $(CONTRIB); do echo "cd $$m && $(GO) vet ./..."; (cd $$m && $(GO) vet ./...) || exit 1; done

test: deps vet
	@$(if $(RACE),:,echo "no C compiler for cgo: running the tests without the race detector (install gcc to get it)" >&2)
	$(GO) test $(TESTFLAGS) ./...
	@# sync.Pool drops items at random under the race detector: the allocation counts run without it.
	$(GO) test -count=1 -run 'AllocatesNothing' ./internal/engine/
	cd bench && $(GO) test -count=1 -run . -bench . -benchtime 1x $$($(GO) list ./... | grep -v -e /loadgen -e /cmd/)
	cd bench && $(GO) test $(TESTFLAGS) $(LOADGEN)
	@for m in $(CONTRIB); do echo "cd $$m && $(GO) test $(TESTFLAGS) ./..."; (cd $$m && $(GO) test $(TESTFLAGS) ./...) || exit 1; done

test-short: deps
	@$(if $(RACE),:,echo "no C compiler for cgo: running the tests without the race detector (install gcc to get it)" >&2)
	$(GO) test -short $(TESTFLAGS) ./...
	cd bench && $(GO) test -short $(TESTFLAGS) $(LOADGEN)
	@for m in $(CONTRIB); do (cd $$m && $(GO) test -short $(TESTFLAGS) ./...) || exit 1; done

# Full benchmarks; see docs/PERFORMANCE.md for the commands behind each figure.
bench: deps
	cd bench && $(GO) test -run '^$$' -bench . -benchmem ./...

# Short fuzzing runs of every fuzz target.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime 20s $$pkg || exit 1; \
	  done; \
	done

# Check and unit-test the Prometheus rules in deploy/ with promtool (the
# deploy package's Go test does the same when promtool is installed).
rules:
	promtool check rules deploy/prometheus/sluice-rules.yml
	promtool test rules deploy/prometheus/sluice-rules.test.yml
