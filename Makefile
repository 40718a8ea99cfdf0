# Strand. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO    ?= go
BIN   := bin
DATA  ?= .strand
export TESTCONTAINERS_RYUK_DISABLED := true

CMDS := strand-broker:./services/broker strand-controller:./services/controller \
        strand-recoverer:./services/recoverer strandctl:./cmd/strandctl

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every binary into bin/.
	@echo "building $(BIN)/ (the first build takes a minute)..."
	@mkdir -p $(BIN)
	@for c in $(CMDS); do $(GO) build -o $(BIN)/$${c%%:*} $${c#*:} || exit 1; done

.PHONY: run
run: build ## Start a local cluster (embedded etcd, controller, recoverer, 3 brokers) with data in .strand/.
	$(BIN)/strandctl dev --data-dir $(DATA) --bin-dir $(BIN)

.PHONY: test
test: ## Run every test suite with -race (unit, integration, CLI smoke, e2e), then each fuzz target briefly.
	@# Build and link every test binary once, in parallel, then run the
	@# packages one at a time: the process, in-process and container
	@# clusters run on short leases and must not starve each other's etcd
	@# on a 2-core machine (scripts/test.sh says why not go test -p 1).
	@GO=$(GO) TEST_TIMEOUT=25m scripts/test.sh
	@echo "fuzzing each target for $(FUZZ_SHORT) inputs (seeds ran above)..."
	@GO=$(GO) scripts/fuzz.sh $(FUZZ_SHORT)

# Fuzz budgets: `make test` runs each target for FUZZ_SHORT inputs after
# its seeds, `make fuzz` for FUZZTIME (a duration or a count, e.g. 1000x).
FUZZ_SHORT ?= 200x
FUZZTIME   ?= 30s

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME (30s) each, one at a time; failing inputs land in testdata/fuzz.
	@GO=$(GO) FUZZ_CACHE=go scripts/fuzz.sh $(FUZZTIME)

.PHONY: test-short
test-short: ## Run the unit and integration tests without the e2e suite.
	@GO=$(GO) TEST_TIMEOUT=20m scripts/test.sh $$($(GO) list ./... | grep -v /e2e)

# Container images (deploy/docker): static binaries built on the host with the
# Go build cache, then `docker build` FROM scratch with a context holding only
# the binary and the health probe, so an unchanged binary is a cached build.
IMAGE_TAG    ?= dev
IMAGE_DIR    := $(BIN)/images
IMAGE_GOARGS := -trimpath -buildvcs=false -ldflags "-s -w"
# image:binary:package
IMAGES := broker:strand-broker:./services/broker controller:strand-controller:./services/controller \
          recoverer:strand-recoverer:./services/recoverer etcd:etcd:go.etcd.io/etcd/server/v3

# The certificates of deploy/compose/compose.secure.yaml, made by strandctl
# cert: a CA, a node certificate per service on the shared loopback, an
# admin client certificate. What exists is kept; RENEW=1 issues the node and
# client certificates again with the same CA (the services pick them up
# without a restart).
COMPOSE_CERTS  := deploy/compose/certs
COMPOSE_NODES  := etcd controller recoverer broker-1 broker-2 broker-3

.PHONY: compose-certs
compose-certs: build ## Certificates for deploy/compose/compose.secure.yaml in deploy/compose/certs/ (RENEW=1 reissues them).
	@d=$(COMPOSE_CERTS); ow=$(if $(RENEW),--overwrite,); \
	test -f $$d/ca.crt || $(BIN)/strandctl cert create-ca --dir $$d || exit 1; \
	for n in $(COMPOSE_NODES); do \
		if [ -n "$$ow" ] || [ ! -f $$d/$$n/node.crt ]; then \
			$(BIN)/strandctl cert create-node $$n --dir $$d --out-dir $$d/$$n --hosts localhost,127.0.0.1 $$ow || exit 1; \
		fi; \
	done; \
	if [ -n "$$ow" ] || [ ! -f $$d/client.admin.crt ]; then $(BIN)/strandctl cert create-client admin --dir $$d $$ow || exit 1; fi

.PHONY: images
images: ## Build the FROM scratch images strand/{broker,controller,recoverer,etcd}:dev (IMAGE_TAG).
	@command -v docker >/dev/null || { echo "make images: docker is not installed"; exit 1; }
	@mkdir -p $(IMAGE_DIR)
	@export CGO_ENABLED=0 GOOS=linux; \
	$(GO) build $(IMAGE_GOARGS) -o $(IMAGE_DIR)/strand-healthprobe ./deploy/healthprobe || exit 1; \
	for i in $(IMAGES); do \
		name=$${i%%:*}; rest=$${i#*:}; bin=$${rest%%:*}; pkg=$${rest#*:}; \
		$(GO) build $(IMAGE_GOARGS) -o $(IMAGE_DIR)/$$bin $$pkg || exit 1; \
	done
	@for i in $(IMAGES); do \
		name=$${i%%:*}; rest=$${i#*:}; bin=$${rest%%:*}; ctx=$(IMAGE_DIR)/ctx-$$name; \
		mkdir -p $$ctx && ln -f $(IMAGE_DIR)/$$bin $(IMAGE_DIR)/strand-healthprobe $$ctx/ || exit 1; \
		out=$$(DOCKER_BUILDKIT=0 docker build -q -t strand/$$name:$(IMAGE_TAG) -f deploy/docker/$$name.Dockerfile $$ctx 2>&1) || { echo "$$out"; exit 1; }; \
		echo "strand/$$name:$(IMAGE_TAG)"; \
	done
	@# Images the new builds replaced (untagged) would pile up build after build.
	@docker image prune -f --filter label=dev.strand.image >/dev/null

.PHONY: e2e
e2e: images ## Run the testcontainers e2e suite (needs Docker; fails without it). Logs of a failed test: e2e/logs/.
	STRAND_E2E_SKIP_IMAGES=1 $(GO) test -count=1 -timeout 15m -v ./e2e/...

.PHONY: bench
bench: ## Run the Go benchmarks (storage publish, fsync floor).
	$(GO) test -run '^$$' -bench . -benchtime 2s ./services/broker/...

.PHONY: generate
generate: ## Regenerate code from proto/ (buf, protoc-gen-go, protoc-gen-connect-go as Go tools).
	$(GO) tool buf generate

.PHONY: check-generate
check-generate: generate check-badger ## Fail if generated code is out of date, or third_party/badger is not upstream plus its patches.
	@test -z "$$(git status --porcelain -- api)" || { git status --porcelain -- api; echo "generated code differs: run make generate"; exit 1; }

# third_party/badger is Badger at go.mod's required version, trimmed, with
# third_party/badger-patches applied in order (third_party/badger.sh; the
# tree's README says why and how to upgrade).
.PHONY: badger
badger: ## Regenerate third_party/badger: Badger at go.mod's version plus third_party/badger-patches.
	@GO=$(GO) third_party/badger.sh third_party/badger

.PHONY: check-badger
check-badger: ## Fail, showing the diff, if third_party/badger differs from Badger at go.mod's version plus its patches.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	GO=$(GO) third_party/badger.sh "$$tmp/badger" || exit 1; \
	diff -ruN "$$tmp/badger" third_party/badger || { \
		echo "third_party/badger differs (+ lines) from Badger at go.mod's version plus third_party/badger-patches:"; \
		echo "make a change to it a patch in third_party/badger-patches, then run make badger"; exit 1; }

.PHONY: lint
lint: ## go vet, buf lint, buf format, gofmt and golangci-lint (.golangci.yml; pinned in go.mod as a Go tool).
	$(GO) vet ./...
	cd examples && $(GO) vet ./...
	$(GO) tool buf lint
	$(GO) tool buf format -d --exit-code
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^api/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^api/'); exit 1; }
	@echo "golangci-lint (its first run compiles it: a minute or two)..."
	$(GO) tool golangci-lint run ./...

.PHONY: fmt
fmt: ## gofmt every Go file and buf format the protos.
	gofmt -w $$(git ls-files '*.go' | grep -v '^api/')
	$(GO) tool buf format -w

.PHONY: clean
clean: ## Remove bin/ (keeps .strand/ data).
	rm -rf $(BIN)

.PHONY: bench-nats
bench-nats: build ## NATS JetStream R3 and strandctl bench, alternating: Strand's throughput and confirm p99 as ratios of NATS's (bench/natsjs; PAIRS=3).
	env -u STRAND_CONTROLLER -u STRAND_BROKER bench/natsjs/compare.sh $(or $(PAIRS),3) 16 2

.PHONY: bench-failover
bench-failover: build ## Cluster bench: 3 copies, majority_durable, 1 KiB, 256 in flight, SIGKILL the owner at 8 s of 20.
	@# The kill needs the bench's own cluster: an exported STRAND_CONTROLLER or
	@# STRAND_BROKER (the compose README sets them) would point it elsewhere.
	env -u STRAND_CONTROLLER -u STRAND_BROKER $(BIN)/strandctl bench --stream durable --copies 3 --policy majority_durable --size 1024 --inflight 256 \
		--duration 20s --kill-owner-at-secs 8 --bin-dir $(BIN) $(BENCH_FLAGS)
