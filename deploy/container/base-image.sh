#!/usr/bin/env bash
# A local stand-in for debian:bookworm-slim, for machines that cannot pull images (this
# project's CI: no registry is reachable there, the Debian archive is). The Dockerfile's
# `FROM debian:bookworm-slim` then builds unchanged; anywhere a registry answers, do not run
# this: `podman build` or `docker build` pulls the real image.
#
#   deploy/container/base-image.sh [IMAGE]     (root; IMAGE defaults to debian:bookworm-slim)
#
# Idempotent: an existing IMAGE is kept (`podman image rm IMAGE` to make it again). Made with
# `debootstrap --variant=minbase bookworm` from DEBIAN_MIRROR (default deb.debian.org), then
# given what the real image has that matters to a build: apt's sources in the deb822 form
# (bookworm, bookworm-updates, bookworm-security), no package lists or cached .debs, PATH, and
# `bash` as its command. Takes 1-3 minutes and about 90 MB.
set -euo pipefail

image=${1:-debian:bookworm-slim}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

for tool in podman debootstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "base-image.sh: $tool is not installed: apt-get install $tool" >&2
    exit 1
  fi
done
if podman image exists "$image"; then
  echo "base-image.sh: $image exists, kept"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "base-image.sh: debootstrap needs root" >&2
  exit 1
fi

root=$(mktemp -d /var/tmp/raftcron-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 30 "$root.log" >&2
  rm -f "$root.log"
  echo "base-image.sh: debootstrap failed (above)" >&2
  exit 1
}
rm -f "$root.log"

rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
rm -f "$root/etc/hostname" "$root/etc/resolv.conf"  # the runtime provides both

tar --numeric-owner -C "$root" -c . | podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' \
  --change 'LABEL org.raftcron.base-image=debootstrap' \
  - "$image" >/dev/null
echo "base-image.sh: made $image (debootstrap --variant=minbase bookworm, $mirror)"
