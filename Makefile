# kvroute — see README.md. `make test` is what CI runs.
GO       ?= go
BIN      := bin/kvroute
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Time per fuzz target for `make fuzz` (each ran ≥ 60 s for docs/benchmarks.md).
FUZZTIME ?= 10s
# Benchmarks to run with `make bench` (a go test -bench regexp).
BENCH    ?= .
PROTO    := $(shell find proto -name '*.proto' 2>/dev/null)

.PHONY: all deps build test lint fuzz bench proto demo clean

all: build

## deps: install what the build and tests need (apt packages, pinned Go tools)
deps:
	@./scripts/deps.sh

## build: the one binary, bin/kvroute
build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/kvroute

## test: deps, then every unit and integration test with the race detector
# test/e2e (real processes, about nine minutes, mostly waiting on them) is
# listed first so that it starts first and the other packages run beside
# it, not before it: go test starts packages in the order given.
test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./test/e2e/ $$($(GO) list ./... | grep -v '/test/e2e$$')

## lint: go vet and the pinned staticcheck
lint: deps
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

## fuzz: every fuzz target for FUZZTIME each
fuzz: deps
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$target ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

## bench: every benchmark (BENCH=regexp to narrow), with allocations
bench: deps
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem ./...

## proto: regenerate Go code from proto/ (generated code is committed)
proto: deps
	@if [ -z "$(PROTO)" ]; then echo "proto: no .proto files under proto/"; exit 0; fi; \
	PATH="$$(mktemp -d):$$PATH"; tooldir=$${PATH%%:*}; \
	$(GO) build -o $$tooldir/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc && \
	protoc -I proto --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative $(PROTO) && \
	rm -rf $$tooldir && echo "proto: generated $(PROTO)"

## demo: the main job — a local fleet, an agentic workload, a side-by-side
## report in demo-report/report.html (deps first: the build needs libzmq)
demo: deps
	$(MAKE) --no-print-directory build
	./$(BIN) demo

clean:
	rm -rf bin
