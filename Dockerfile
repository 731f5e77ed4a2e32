# syntax=docker/dockerfile:1
# The one kvroute image: every subcommand (picker, sidecar, engine, bench,
# demo, inject, verify) in one binary. cgo links libzmq, so both stages are
# Debian bookworm: the build stage has the headers, the runtime stage only
# the shared library.
#
#   docker build -t kvroute:dev .
#   docker run --rm kvroute:dev --help

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq3-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so source edits reuse the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kvroute ./cmd/kvroute

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 kvroute \
 && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin kvroute
COPY --from=build /out/kvroute /usr/local/bin/kvroute
USER 65532:65532
# Picker HTTP and gRPC, sidecar gRPC and debug, gossip (TCP and UDP).
EXPOSE 8080 8081 9000 9001 9090 8090 7946 7946/udp
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["--help"]
