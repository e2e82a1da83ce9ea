#!/usr/bin/env bash
# Make the image test's base image and fill podman's layer cache ahead of the test, for CI:
# `.ci/run` starts this in the background while lint and the unit tier run (they use the CPU;
# this mostly waits on the network), so the test (tests/container/test_image.py) builds from
# the cache instead of downloading for minutes. Both take the lock LOCK: the test waits for a
# warm-up under way rather than doing the same work beside it.
#
#   deploy/container/warm-build.sh     (root; podman, runc, debootstrap and flock installed)
#
# The build's arguments are the test's (network host, the host's CA bundle as the
# `ca-certificates` secret, the Dockerfile, the checkout as context): a drift between the two
# costs a cache miss, never a wrong test. The image is tagged localhost/raftcron-warm:latest and
# kept, as the base image is: its layers are the cache.
set -euo pipefail
cd "$(dirname "$0")/../.."

LOCK=${RAFTCRON_IMAGE_LOCK:-/var/tmp/raftcron-image.lock}
exec 9>"$LOCK"
flock 9
# The commands below run with the lock's descriptor closed (9>&-): a process they leave behind
# (podman's helpers) must not hold the lock after this script ends.
deploy/container/base-image.sh 9>&-
secret=()
bundle=${PIP_CERT:-$(python3 -c 'import ssl; print(ssl.get_default_verify_paths().cafile or "")')}
if [ -n "$bundle" ] && [ -e "$bundle" ]; then
  secret=(--secret "id=ca-certificates,src=$bundle")
fi
podman --runtime runc build --network host "${secret[@]}" --file Dockerfile \
  --tag localhost/raftcron-warm:latest . 9>&-
