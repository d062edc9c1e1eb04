# Sluice's container image: a static binary on distroless, run as a non-root
# user. Build it from the repository's root:
#
#	docker build -t sluice .
#	docker build -t sluice:v1.2.3 --build-arg VERSION=v1.2.3 \
#	  --build-arg COMMIT=$(git rev-parse HEAD) \
#	  --build-arg DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) .
#
# The image has no shell, so it has no HEALTHCHECK: probe GET /healthz
# (alive) and GET /readyz (ready: configuration loaded, store answering) on
# the HTTP port from outside, as deploy/kubernetes/ and deploy/compose/ do.

FROM golang:1.26 AS build
WORKDIR /src
# The modules first, so that a change of the code alone reuses their layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The version, commit and date that `sluice version`, /healthz and
# sluice_build_info report (internal/buildinfo; the Makefile's build sets
# the same).
ARG VERSION=dev
ARG COMMIT=unknown
ARG DATE=unknown
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/sluicehq/sluice/internal/buildinfo.version=${VERSION} -X github.com/sluicehq/sluice/internal/buildinfo.commit=${COMMIT} -X github.com/sluicehq/sluice/internal/buildinfo.date=${DATE}" \
      -o /out/sluice ./cmd/sluice

# distroless/static: CA certificates, /etc/passwd with the nonroot user
# (65532), tzdata; no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
# sluice serve listens on loopback by default; in a container, on every
# interface. Flags given to the container win over these.
ENV SLUICE_HTTP_ADDR=0.0.0.0:8080 \
    SLUICE_GRPC_ADDR=0.0.0.0:8081 \
    SLUICE_LOG_FORMAT=json
# 8080: HTTP JSON API, /healthz, /readyz, /metrics, /ui/.
# 8081: gRPC, Sluice's API and Envoy's rate limit service.
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
