#!/usr/bin/env bash
# Build the sandbox images with Podman or Docker, each only when it is missing or its recipe changed.
#
#   sandboxes/build.sh [python|swe|swe-testbed|all] [--force]   (default: python; --force rebuilds each)
#   sandboxes/build.sh swe-project PROJECT.json [--force]
#   --no-cache: build what is out of date without the layer cache (--force implies it)
#   --hosts URL[,URL...]: then make the images the target names available on each of these engines
#     (unix://, tcp://, ssh://; the ones $AGENTRL_SANDBOX_HOSTS lists): `save | --url URL load` for
#     each image whose id there differs from the local one, "up to date" otherwise
#
# 1. Base, localhost/agentrl-debian:bookworm: pulled from $BASE_PULL when its registry answers,
#    otherwise bootstrapped with debootstrap (minbase + python3, mirror from the apt sources) and
#    imported, without apt lists, docs, man pages or locales.
# 2. python: sandboxes/python/Containerfile -> localhost/agentrl-python:latest (the sandbox image).
# 3. swe (with `swe` or `all`): sandboxes/swe/Containerfile -> localhost/agentrl-swe-base:latest,
#    then one image per shipped SWE project (agentrl/envs/swe/data/projects/*.json, or those in
#    $SWE_PROJECTS): sandboxes/swe-project/Containerfile -> localhost/agentrl-swe-<name>:<version>.
#    `swe-project PROJECT.json` builds the base and that one project's image.
# 4. swe-testbed (also with `swe` or `all`): one image per shipped SWE instance in SWE-bench's
#    layout, sweb.eval.x86_64.<instance_id>:latest: its project's image plus /testbed, the base tree
#    as a git repository at base_commit (sandboxes/swe-testbed/Containerfile; the context written
#    by `python -m agentrl.envs.swe.testbed`, run with $AGENTRL_PYTHON [.venv/bin/python], without
#    which `swe` and `all` skip these images and `swe-testbed` fails). Checked after the build:
#    HEAD is base_commit and the tree is clean. The same recipe builds one image per shipped
#    project in SWE-smith's layout (swebench/swesmith.x86_64.agentrl-taskgen_1776_<name>.<commit>,
#    /testbed the clean tree at environment_setup_commit), which the listing names too, and
#    sandboxes/swe-r2e/Containerfile one per instance in R2E-Gym's layout
#    (agentrl-r2e/<name>_final:<commit_hash>: /testbed at base_commit with run_tests.sh and .venv,
#    /r2e_tests the hidden tests); each listed line names its recipe.
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
nocache=0
projects=()
hosts=()
usage="usage: sandboxes/build.sh [python|swe|swe-testbed|all] [--force] [--hosts URL,...] | swe-project PROJECT.json [--force]"
expect_hosts=0
for arg in "$@"; do
  if [ "$expect_hosts" = 1 ]; then
    IFS=, read -r -a hosts <<<"$arg"
    expect_hosts=0
    continue
  fi
  case $arg in
    python | swe | swe-testbed | all | swe-project) target=$arg ;;
    --force) force=1 ;;
    --no-cache) nocache=1 ;;
    --hosts) expect_hosts=1 ;;
    --hosts=*) IFS=, read -r -a hosts <<<"${arg#--hosts=}" ;;
    *.json)
      [ "$target" = swe-project ] || die "$arg: a project file goes after swe-project ($usage)"
      projects+=("$arg")
      ;;
    *) die "unknown argument '$arg' ($usage)" ;;
  esac
done
[ "$expect_hosts" = 0 ] || die "--hosts needs a comma-separated list of URLs ($usage)"
for url in ${hosts[@]+"${hosts[@]}"}; do
  case $url in
    unix:///* | tcp://?* | ssh://?*) ;;
    *) die "bad host URL '$url': use unix:///path, tcp://host:port or ssh://[user@]host" ;;
  esac
done
if [ "$target" = swe-project ]; then
  [ "${#projects[@]}" -gt 0 ] || die "swe-project needs a project file ($usage)"
elif [ "$target" = swe ] || [ "$target" = swe-testbed ] || [ "$target" = all ]; then
  projects=("${SWE_PROJECTS:-$here/../agentrl/envs/swe/data/projects}"/*.json)
fi

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

# $1: recipe directory under sandboxes/, $2: image, $3: the image it starts FROM, then build args
build_recipe() {
  local recipe_dir=$1 file=$here/$1/Containerfile image=$2 from=$3 start=$SECONDS recipe
  shift 3
  recipe=$({
    cat "$file"
    inspect "$from" '{{.Id}}'
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; fi # none for python and swe: their hashes stay
  } | sha256sum | cut -c1-16)
  if [ "$force" = 0 ] && [ "$(inspect "$image" '{{index .Config.Labels "agentrl.recipe"}}')" = "$recipe" ]; then
    log "$image: up to date"
    return
  fi
  log "$image: building from sandboxes/$recipe_dir/Containerfile"
  local options=(--build-arg "BASE=$from" --label "agentrl.recipe=$recipe" -t "$image" -f "$file")
  local arg
  for arg in "$@"; do options+=(--build-arg "$arg"); done
  if [ "$force" = 1 ] || [ "$nocache" = 1 ]; then options+=(--no-cache); fi
  local build_log
  build_log=$(mktemp -t agentrl-build.XXXXXX)
  "$cli" build "${options[@]}" "${build_context:-$here/$recipe_dir}" >"$build_log" 2>&1 || {
    tail -n 30 "$build_log" >&2
    die "building $image failed (log: $build_log)"
  }
  rm -f "$build_log"
  # What the container backend relies on: uid 65534 can write to the tmpfs /work and run python3.
  "$cli" run --rm --network none --read-only --user 65534:65534 --tmpfs /work:rw,size=16m,mode=1777 \
    "$image" python3 -c 'open("/work/probe", "w").write("ok")' ||
    die "$image was built, but uid 65534 cannot write to /work in it"
  built "$image" "$start"
}

# One SWE project's image, named and configured by its project file as agentrl.envs.swe.images
# reads it: localhost/agentrl-swe-<name>:<version> with the project's apt_packages.
build_project() {
  local fields image project packages
  fields=$(python3 -c '
import json, re, sys
project = json.load(open(sys.argv[1]))
name = re.sub(r"[^a-z0-9_.-]+", "-", project["name"].lower())
version = re.sub(r"[^A-Za-z0-9_.-]+", "-", project["version"])
print(f"localhost/agentrl-swe-{name}:{version}")
print(project["name"] + "==" + project["version"])
print(" ".join(project.get("apt_packages", [])))
' "$1") || die "$1 is not a readable SWE project file"
  { read -r image; read -r project; read -r packages || true; } <<<"$fields" # no packages: no line
  build_recipe swe-project "$image" "$SWE_IMAGE" "APT_PACKAGES=$packages" "PROJECT=$project"
  built_images+=("$image")
}

# The shipped SWE instances' images in SWE-bench's layout (step 4 above), each built from a
# context that `python -m agentrl.envs.swe.testbed context` writes only when the image is stale.
build_testbeds() {
  local python=${AGENTRL_PYTHON:-$here/../.venv/bin/python} listing image from commit id recipe
  if [ ! -x "$python" ]; then
    [ "$target" = swe-testbed ] && die "$python is missing: run \`make\` first (or set AGENTRL_PYTHON)"
    log "skipping the SWE-bench-layout images: $python is missing (run \`make\`, then sandboxes/build.sh swe-testbed)"
    return
  fi
  listing=$("$python" -m agentrl.envs.swe.testbed list) || die "listing the SWE instances failed"
  # Each image's recipe label, in one call (a missing image is only missing from the output).
  local -A have=() from_id=()
  local stale=() recipe_dir
  while read -r id recipe; do
    [ -n "$id" ] && have[$id]=$recipe
  done < <(awk '{ print $1 }' <<<"$listing" | xargs "$cli" image inspect \
    --format '{{index .Config.Labels "agentrl.swe.instance"}} {{index .Config.Labels "agentrl.recipe"}}' 2>/dev/null)
  while read -r image from commit id recipe_dir; do
    [ -n "${from_id[$from]:-}" ] || from_id[$from]=$(inspect "$from" '{{.Id}}')
    recipe=$({
      cat "$here/$recipe_dir/Containerfile"
      echo "${from_id[$from]}"
      printf '%s\n' "INSTANCE=$id" "BASE_COMMIT=$commit"
    } | sha256sum | cut -c1-16)
    if [ "$force" = 1 ] || [ "${have[$id]:-}" != "$recipe" ]; then
      stale+=("$id")
    else
      log "$image: up to date"
    fi
    built_images+=("$image")
  done <<<"$listing"
  [ "${#stale[@]}" -gt 0 ] || return 0
  local contexts
  contexts=$(mktemp -d /var/tmp/agentrl-testbed.XXXXXX)
  trap 'rm -rf "$contexts"' EXIT
  "$python" -m agentrl.envs.swe.testbed context "$contexts" "${stale[@]}" ||
    die "writing the build contexts of ${stale[*]} failed"
  local check
  while read -r image from commit id recipe_dir; do
    [ -d "$contexts/$id" ] || continue
    local build_context=$contexts/$id # build_recipe builds from it
    build_recipe "$recipe_dir" "$image" "$from" "INSTANCE=$id" "BASE_COMMIT=$commit" </dev/null
    # R2E-Gym's layout keeps run_tests.sh untracked in /testbed and needs its /r2e_tests.
    check='git rev-parse HEAD && git status --porcelain'
    [ "$recipe_dir" = swe-r2e ] &&
      check='test -s run_tests.sh && test -x .venv/bin/python && test -d /r2e_tests && git rev-parse HEAD && git status --porcelain --untracked-files=no'
    [ "$("$cli" run --rm --network none "$image" sh -c "$check" </dev/null)" = "$commit" ] ||
      die "$image: /testbed is not a clean git checkout of base_commit $commit (sandboxes/$recipe_dir)"
  done <<<"$listing"
  rm -rf "$contexts"
  trap - EXIT
}

# The CLI talking to engine $1: podman --url URL, docker -H URL (TLS from DOCKER_CERT_PATH).
remote() {
  local url=$1
  shift
  if [ "$(basename "$cli")" = podman ]; then "$cli" --url "$url" "$@"; else "$cli" -H "$url" "$@"; fi
}

# $1: engine URL, then images: each one whose id differs there is saved here and loaded there.
copy_images() {
  local url=$1 image start local_id
  shift
  remote "$url" version >/dev/null 2>&1 || die "no engine answers at $url"
  for image in "$@"; do
    local_id=$(inspect "$image" '{{.Id}}') || die "$image is not in the local image store"
    if [ "$(remote "$url" image inspect --format '{{.Id}}' "$image" 2>/dev/null)" = "$local_id" ]; then
      log "$image: up to date on $url"
      continue
    fi
    start=$SECONDS
    log "$image: loading on $url"
    "$cli" save "$image" | remote "$url" load >/dev/null || die "loading $image on $url failed"
    log "$image: loaded on $url in $((SECONDS - start)) s"
  done
}

built_images=() # what --hosts copies: the images sandboxes run, not the base
build_base
if [ "$target" = python ] || [ "$target" = all ]; then
  build_recipe python "$PYTHON_IMAGE" "$BASE_IMAGE"
  built_images+=("$PYTHON_IMAGE")
fi
if [ "$target" != python ]; then
  build_recipe swe "$SWE_IMAGE" "$BASE_IMAGE"
  built_images+=("$SWE_IMAGE")
  for project in "${projects[@]}"; do
    build_project "$project"
  done
fi
if [ "$target" = swe ] || [ "$target" = swe-testbed ] || [ "$target" = all ]; then
  build_testbeds
fi
for url in ${hosts[@]+"${hosts[@]}"}; do
  copy_images "$url" "${built_images[@]}"
done
