#!/usr/bin/env bash
# make release VERSION=x.y.z: one version for everything released together.
# Bumps the workspace's version (every crate's, and so MODULE LIST's `ver`
# and INFO's rl_version, which the module reads from it at build time), the
# versions on path dependencies, the image tags of deploy/kubernetes/ and the
# version docs/install.md names (image tags, archive and package names, the
# crate), turns CHANGELOG.md's "Unreleased" into this version's section, and
# updates Cargo.lock. The archives and images take their names from the
# workspace's version (dist.sh, images.sh). deploy/tests/version.rs holds
# them all to one version; docs/install.md#one-version says what to run next.
set -euo pipefail

new=${1:-}
root=${RELEASE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
if ! [[ $new =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
	echo "release: VERSION='$new' is not major.minor.patch (make release VERSION=0.3.0)" >&2
	exit 2
fi
old=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
if [ "$old" = "$new" ]; then
	echo "release: the version is $new already" >&2
	exit 2
fi
if ! grep -q '^## Unreleased$' "$root/CHANGELOG.md"; then
	echo "release: CHANGELOG.md has no '## Unreleased' section to release" >&2
	exit 2
fi
o=${old//./\\.}

# The workspace's version (the first `version = ` line: [workspace.package]).
sed -i "0,/^version = \"$o\"/s//version = \"$new\"/" "$root/Cargo.toml"
# Path dependencies carry the version they publish with.
for f in "$root"/Cargo.toml "$root"/*/Cargo.toml "$root"/tools/*/Cargo.toml; do
	sed -i "s/{ version = \"$o\", path = /{ version = \"$new\", path = /" "$f"
done
# Image tags in the manifests.
sed -i -E "s/^( *image: [a-z-]+):$o\$/\1:$new/" "$root"/deploy/kubernetes/*.yaml
# What docs/install.md tells users to run and download.
sed -i -E "s/(redis-rl|redis-rl-valkey|rl-relay):$o/\1:$new/g; s/-$o-x86_64/-$new-x86_64/g; \
	s/_$o-1_amd64/_$new-1_amd64/g; s/= \"$o\"/= \"$new\"/g" "$root/docs/install.md"
# The changelog: what was unreleased is this version's, under a new empty Unreleased.
sed -i "s/^## Unreleased\$/## Unreleased\n\n## $new — $(date -u +%Y-%m-%d)/" "$root/CHANGELOG.md"
if [ -z "${RELEASE_NO_LOCK:-}" ]; then
	(cd "$root" && cargo update --workspace --offline --quiet)
fi
echo "release: $old -> $new. Next: make test, then git commit -am 'Release $new' && git tag v$new, then make dist debs images"
