#!/usr/bin/env bash
# Installs what kvroute's build and tests need on a Debian machine that has
# only Go: libzmq (cgo, through pkg-config), protoc, nginx, Prometheus
# (with promtool) and Chromium from apt, and the Go tools pinned in go.mod. Idempotent: installs only what is missing.
set -euo pipefail

need_apt=()
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libzmq; then
  need_apt+=(libzmq3-dev)
fi
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
# The well-known protobuf types protoc needs next to it.
[ -e /usr/include/google/protobuf/timestamp.proto ] || need_apt+=(libprotobuf-dev)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
# nginx: the end-to-end test of a gateway hashing on x-kvroute-prefix-hash.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
# Prometheus and promtool: the test that scrapes real pickers and sidecars
# as the Prometheus Operator would, and promtool's checks and unit tests of
# the alerts. The tests run their own servers on loopback; on a host with
# systemd the package also enables Debian's own prometheus service (:9090),
# which they do not use.
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } || need_apt+=(prometheus)
# Chromium (headless, driven over its DevTools protocol): the test that opens
# report.html; a font so chart labels render.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
[ -e /usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf ] || need_apt+=(fonts-liberation)

if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "make deps: missing ${need_apt[*]}; install them with apt-get as root (or your package manager), then run make again" >&2
    exit 1
  fi
  echo "make deps: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "${need_apt[@]}" >/tmp/kvroute-apt.log 2>&1; then
    apt-get update -q >>/tmp/kvroute-apt.log 2>&1 || true
    if ! apt-get install -y -q --no-install-recommends "${need_apt[@]}" >>/tmp/kvroute-apt.log 2>&1; then
      echo "make deps: could not install ${need_apt[*]} with apt-get (log: /tmp/kvroute-apt.log)" >&2
      exit 1
    fi
  fi
fi

# Go modules and the pinned Go tools (protoc plugins, staticcheck).
if ! { go mod download && go build tool; } >/tmp/kvroute-go.log 2>&1; then
  echo "make deps: could not fetch or build the Go modules and tools in go.mod (log: /tmp/kvroute-go.log)" >&2
  exit 1
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
echo "make deps: ok (libzmq $(pkg-config --modversion libzmq), $(protoc --version), $("$nginx_bin" -v 2>&1 | sed 's/.*: //'), prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), $(chromium --version 2>/dev/null | head -1))"
