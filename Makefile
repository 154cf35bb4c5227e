# redis-rl: `make run` starts a server with the module, `make test` runs every test.
# Both install what is missing first (Debian packages with apt-get when root).

PORT ?= 6379
MODULE := target/release/libredis_rl.so
DEB_PACKAGES := redis-server redis-tools libclang-dev

.PHONY: run test build deps unit clean

run: deps build
	redis-server ./redis.conf.example --port $(PORT)

test: deps build
	RL_MODULE=$(CURDIR)/$(MODULE) cargo test --workspace

build:
	cargo build --release -p redis-rl

# Pure tests only: no server, no module build.
unit:
	cargo test -p rl-core -p redis-rl --lib

# redis-server and redis-cli to run and test against; libclang for the
# bindgen step of the redis-module crate.
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	[ -n "$$LIBCLANG_PATH" ] || ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo "missing:$$missing"; \
			echo "install them with:  sudo apt-get install -y$$missing"; \
			exit 1; \
		fi; \
	fi; \
	command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust from https://rustup.rs"; exit 1; }

clean:
	cargo clean
