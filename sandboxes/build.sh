#!/usr/bin/env bash
# Build the sandbox images with Podman or Docker, each only when it is missing or its recipe changed.
#
#   sandboxes/build.sh [python|swe|all] [--force]      (default: python; --force rebuilds each one)
#
# 1. Base, localhost/agentrl-debian:bookworm: pulled from $BASE_PULL when its registry answers,
#    otherwise bootstrapped with debootstrap (minbase + python3, mirror from the apt sources) and
#    imported, without apt lists, docs, man pages or locales.
# 2. python: sandboxes/python/Containerfile -> localhost/agentrl-python:latest (the sandbox image).
# 3. swe (with `swe` or `all`): sandboxes/swe/Containerfile -> localhost/agentrl-swe-base:latest.
#
# An image is up to date when its `agentrl.recipe` label matches the hash of its Containerfile and
# of the base image's id. Environment (defaults in brackets):
#   CONTAINER_CLI  podman or docker [podman if installed, else docker]
#   BASE_IMAGE     [localhost/agentrl-debian:bookworm]  PYTHON_IMAGE [localhost/agentrl-python:latest]
#   SWE_IMAGE      [localhost/agentrl-swe-base:latest]
#   BASE_PULL      what to pull for the base, registry included [docker.io/library/debian:bookworm-slim]
#   DEBIAN_MIRROR  debootstrap's mirror [the first .../debian URI in /etc/apt/sources.list*]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BASE_IMAGE=${BASE_IMAGE:-localhost/agentrl-debian:bookworm}
PYTHON_IMAGE=${PYTHON_IMAGE:-localhost/agentrl-python:latest}
SWE_IMAGE=${SWE_IMAGE:-localhost/agentrl-swe-base:latest}
BASE_PULL=${BASE_PULL:-docker.io/library/debian:bookworm-slim}
SUITE=bookworm

log() { printf '[sandboxes] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

target=python
force=0
for arg in "$@"; do
  case $arg in
    python | swe | all) target=$arg ;;
    --force) force=1 ;;
    *) die "unknown argument '$arg' (usage: sandboxes/build.sh [python|swe|all] [--force])" ;;
  esac
done

if [ -n "${CONTAINER_CLI:-}" ]; then
  cli=$CONTAINER_CLI
elif command -v podman >/dev/null; then
  cli=podman
else
  cli=docker
fi
command -v "$cli" >/dev/null || die "$cli is not installed: run \`sudo sandboxes/setup.sh\`"
# Rootful Podman's image store is the one its API socket (/run/podman/podman.sock) serves.
if [ "$(basename "$cli")" = podman ] && [ "$(id -u)" != 0 ]; then
  die "podman must build into root's image store, which the API socket serves: run it with sudo"
fi
"$cli" version >/dev/null 2>&1 || die "\`$cli version\` fails: is the engine running (DOCKER_HOST=${DOCKER_HOST:-})?"

# Two concurrent runs (two `make test`) would both bootstrap the base: let the second one wait.
if [ "$(id -u)" = 0 ]; then
  mkdir -p /run/lock
  exec 9>/run/lock/agentrl-sandboxes-build.lock
  flock -n 9 || {
    log "waiting for another sandboxes/build.sh"
    flock 9
  }
fi

inspect() { "$cli" image inspect --format "$2" "$1" 2>/dev/null; }
size() { inspect "$1" '{{.Size}}' | awk '{ printf "%d MB", $1 / 1e6 }'; }
built() { log "$1: built in $((SECONDS - $2)) s, $(size "$1")"; }

# The first plain http(s) mirror of Debian's main archive in the apt sources (one-line or deb822).
debian_mirror() {
  grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
    awk '{ print $2; exit }'
}

registry_answers() {
  local host=${BASE_PULL%%/*}
  [ "$host" = docker.io ] && host=registry-1.docker.io
  command -v curl >/dev/null && curl -s -o /dev/null --max-time 3 "https://$host/v2/"
}

bootstrap_base() {
  command -v debootstrap >/dev/null || die "debootstrap is not installed: run \`sudo sandboxes/setup.sh\`"
  [ "$(id -u)" = 0 ] || die "debootstrap needs root: run it with sudo"
  local mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
  mirror=${mirror:-http://deb.debian.org/debian}
  local start=$SECONDS debootstrap_log=/var/tmp/agentrl-debootstrap.log
  rootfs=$(mktemp -d /var/tmp/agentrl-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "$BASE_IMAGE: building with debootstrap $SUITE from $mirror (1-2 min)"
  debootstrap --variant=minbase --include=python3 "$SUITE" "$rootfs" "$mirror" >"$debootstrap_log" 2>&1 || {
    tail -n 20 "$debootstrap_log" >&2
    die "debootstrap failed (log: $debootstrap_log)"
  }
  # Later installs (the swe recipe) skip docs, man pages and locales too, as in Debian's slim images.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/01-agentrl-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  tar -C "$rootfs" --numeric-owner \
    --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/cache/apt/*.bin' \
    --exclude='./var/lib/apt/lists/*' --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' \
    --exclude='./usr/share/locale/*' --exclude='./usr/share/info/*' -c . |
    "$cli" import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >"$debootstrap_log" 2>&1 || {
    cat "$debootstrap_log" >&2
    die "importing the root file system as $BASE_IMAGE failed"
  }
  rm -rf "$rootfs"
  trap - EXIT
  built "$BASE_IMAGE" "$start"
}

build_base() {
  if [ "$force" = 0 ] && inspect "$BASE_IMAGE" '{{.Id}}' >/dev/null; then
    log "$BASE_IMAGE: up to date"
    return
  fi
  if registry_answers; then
    local start=$SECONDS
    log "$BASE_IMAGE: building by pulling $BASE_PULL"
    if "$cli" pull "$BASE_PULL" >&2 && "$cli" tag "$BASE_PULL" "$BASE_IMAGE"; then
      built "$BASE_IMAGE" "$start"
      return
    fi
    log "pulling $BASE_PULL failed: bootstrapping the base instead"
  else
    log "no registry answers for $BASE_PULL: bootstrapping the base"
  fi
  bootstrap_base
}

build_recipe() { # $1: recipe directory under sandboxes/, $2: image
  local file=$here/$1/Containerfile start=$SECONDS recipe
  recipe=$({
    cat "$file"
    inspect "$BASE_IMAGE" '{{.Id}}'
  } | sha256sum | cut -c1-16)
  if [ "$force" = 0 ] && [ "$(inspect "$2" '{{index .Config.Labels "agentrl.recipe"}}')" = "$recipe" ]; then
    log "$2: up to date"
    return
  fi
  log "$2: building from sandboxes/$1/Containerfile"
  local options=(--build-arg "BASE=$BASE_IMAGE" --label "agentrl.recipe=$recipe" -t "$2" -f "$file")
  [ "$force" = 1 ] && options+=(--no-cache)
  local build_log
  build_log=$(mktemp -t agentrl-build.XXXXXX)
  "$cli" build "${options[@]}" "$here/$1" >"$build_log" 2>&1 || {
    tail -n 30 "$build_log" >&2
    die "building $2 failed (log: $build_log)"
  }
  rm -f "$build_log"
  # What the container backend relies on: uid 65534 can write to the tmpfs /work and run python3.
  "$cli" run --rm --network none --read-only --user 65534:65534 --tmpfs /work:rw,size=16m,mode=1777 \
    "$2" python3 -c 'open("/work/probe", "w").write("ok")' ||
    die "$2 was built, but uid 65534 cannot write to /work in it"
  built "$2" "$start"
}

build_base
if [ "$target" != swe ]; then
  build_recipe python "$PYTHON_IMAGE"
fi
if [ "$target" != python ]; then
  build_recipe swe "$SWE_IMAGE"
fi
