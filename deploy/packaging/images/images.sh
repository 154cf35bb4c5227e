#!/bin/sh
# make images: the redis-rl, redis-rl-valkey and rl-relay images, built with
# podman (docker where podman is missing) from the release binaries that
# make dist built. docs/install.md#container-images.
#
# The Containerfiles start FROM debian:bookworm-slim and trixie-slim. Where
# no registry answers, each base is made from Debian's packages instead
# (mmdebstrap --variant=minbase, imported under the same name), so the same
# files build here and anywhere else.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
here="$root/deploy/packaging/images"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
source=$(sed -n 's/^repository = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
release="$root/target/release"
work="$root/target/images"

if command -v podman >/dev/null 2>&1; then
	engine=podman
	: "${CONTAINERS_CONF:=$here/containers.conf}"
	export CONTAINERS_CONF
	# HEALTHCHECK is kept in the docker format only (OCI has no field for it).
	build_flags="--format docker"
elif command -v docker >/dev/null 2>&1 && docker version >/dev/null 2>&1; then
	engine=docker
	build_flags=""
else
	echo "images: neither podman nor a running docker: make deps-images installs podman"
	exit 1
fi

# base SUITE: docker.io/library/debian:SUITE-slim, pulled or made.
base() {
	image="docker.io/library/debian:$1-slim"
	$engine image inspect "$image" >/dev/null 2>&1 && return 0
	if timeout 60 $engine pull -q "$image" >/dev/null 2>&1; then return 0; fi
	command -v mmdebstrap >/dev/null 2>&1 || { echo "images: cannot pull $image and mmdebstrap is missing (make deps-images)"; exit 1; }
	echo "images: no registry: $image from Debian's packages (mmdebstrap)"
	mkdir -p "$work"
	mmdebstrap --quiet --variant=minbase "$1" "$work/$1.tar"
	$engine import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["bash"]' "$work/$1.tar" "$image" >/dev/null
	rm -f "$work/$1.tar"
}

# build NAME CONTAINERFILE FILE...: NAME:VERSION and NAME:latest from a
# folder holding FILE... alone (no context upload of the repository).
build() {
	name=$1 file=$2 && shift 2
	ctx="$work/$name"
	rm -rf "$ctx" && mkdir -p "$ctx"
	for f in "$@"; do
		[ -f "$f" ] || { echo "images: $f is missing (make images runs make dist first)"; exit 1; }
		cp "$f" "$ctx/"
	done
	# Without the line tables the release profile keeps (as make dist's archives).
	for f in "$ctx"/*; do
		if [ "$(head -c 4 "$f" | tail -c 3)" = ELF ]; then strip --strip-debug "$f"; fi
	done
	# shellcheck disable=SC2086
	$engine build $build_flags --network host -q -f "$here/$file" \
		--build-arg VERSION="$version" --build-arg SOURCE="$source" \
		-t "$name:$version" -t "$name:latest" "$ctx" >/dev/null
	echo "images: $name:$version"
}

start=$(date +%s)
base bookworm
base trixie
build redis-rl Containerfile.redis "$release/libredis_rl.so" "$root/redis.conf.example" "$here/redis-rl.conf"
build redis-rl-valkey Containerfile.valkey "$release/libredis_rl.so" "$root/redis.conf.example" "$here/redis-rl.conf"
build rl-relay Containerfile.relay "$release/rl-relay" "$here/ratelimit"
echo "images: built in $(($(date +%s) - start)) s"
