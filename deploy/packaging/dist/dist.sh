#!/bin/sh
# make dist: one archive per binary kind for this machine's platform, each with
# the licence, a short README and the version in its name, plus SHA256SUMS.
# Needs the release binaries (make dist builds them first). docs/install.md.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
arch=$(uname -m)
platform="$arch-linux-gnu"
release="$root/target/release"
out="$root/dist"
here="$root/deploy/packaging/dist"
rm -rf "$out" && mkdir -p "$out"

# archive KIND FILE...: dist/KIND-VERSION-PLATFORM.tar.gz with FILE..., the
# licence and README.KIND.md as README.md.
archive() {
	kind=$1 && shift
	name="$kind-$version-$platform"
	stage="$out/$name"
	mkdir -p "$stage"
	for f in "$@"; do
		[ -f "$f" ] || { echo "dist: $f is missing (make dist builds it)"; exit 1; }
		cp "$f" "$stage/"
	done
	# The release profile keeps line tables (debug = 1) for backtraces in
	# place; the archives ship without them (the symbols stay).
	find "$stage" -type f \( -name '*.so' -o -perm -u+x \) -exec strip --strip-debug {} +
	cp "$root/LICENSE" "$stage/LICENSE"
	sed "s/@VERSION@/$version/g; s/@PLATFORM@/$platform/g" "$here/README.$kind.md" >"$stage/README.md"
	tar -C "$out" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"
	rm -rf "$stage"
}

archive redis-rl-module "$release/libredis_rl.so" "$root/redis.conf.example"
archive rl-relay "$release/rl-relay"
archive rl-balancer "$release/rl-balancer"
# The exporter is rlctl's subcommand (rlctl metrics): one binary, one archive.
archive rlctl "$release/rlctl"
(cd "$out" && sha256sum -- *.tar.gz >SHA256SUMS)
echo "dist: $(ls "$out" | tr '\n' ' ')"
