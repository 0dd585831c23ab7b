#!/usr/bin/env bash
# Install and start what the sandbox backends need, on Debian 12; idempotent (about 1 s when all is there).
#
#   sudo sandboxes/setup.sh [python|swe|all]   bubblewrap, rootful Podman and its Docker-compatible API
#                                              socket, then `sandboxes/build.sh` with that argument
#   sandboxes/setup.sh --bwrap-only            bubblewrap only
#
# 1. Installs the Debian packages that are missing: podman runc bubblewrap debootstrap uidmap
#    slirp4netns fuse-overlayfs curl, wordnet-base (the source the Search-v0 corpus is built
#    from, for the test that rebuilds it), and git and python3-pytest (what SWE-v0 needs under the
#    host's /usr to run on bubblewrap); libseccomp2, which compiles the sandboxes' system-call filter,
#    with both (bubblewrap and libseccomp2 alone with --bwrap-only); podman-docker when there is no
#    `docker` command (SWE-bench's harness runs one).
# 2. Writes /etc/containers/containers.conf and storage.conf (runc, cgroupfs, rlimits that fit the
#    host; see sandboxes/README.md for why) and restarts the API service it started when they change.
# 3. Starts `podman system service --time=0 unix:///run/podman/podman.sock` when it does not answer.
# 4. Builds the images that are missing or out of date (sandboxes/build.sh).
# It prints `DOCKER_HOST=unix:///run/podman/podman.sock` last.
#
# When DOCKER_HOST names another engine (a Docker Engine), steps 1-3 install bubblewrap only, and the
# images are built with the docker CLI against that engine. Run as a user other than root, it only
# checks, and fails with what is missing. PODMAN_SOCK moves the socket (and the service's pid file).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
SOCK=${PODMAN_SOCK:-/run/podman/podman.sock}
PIDFILE=$(dirname "$SOCK")/podman-service.pid
SERVICE_LOG=/var/log/podman-service.log
MARKER="# Managed by sandboxes/setup.sh"

log() { printf '[sandboxes] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

mode=podman
build_args=()
for arg in "$@"; do
  case $arg in
    --bwrap-only) mode=bwrap ;;
    python | swe | all | --force) build_args+=("$arg") ;;
    *) die "unknown argument '$arg' (usage: sandboxes/setup.sh [python|swe|all] [--force] | --bwrap-only)" ;;
  esac
done
if [ "$mode" = podman ] && [ -n "${DOCKER_HOST:-}" ] && [ "$DOCKER_HOST" != "unix://$SOCK" ]; then
  mode=engine
  log "DOCKER_HOST=$DOCKER_HOST: using that engine, not installing Podman"
fi

root=0
[ "$(id -u)" = 0 ] && root=1
missing=() # what a non-root run found missing
if [ "$root" = 1 ]; then
  mkdir -p /run/lock
  exec 8>/run/lock/agentrl-sandboxes-setup.lock
  flock -n 8 || {
    log "waiting for another sandboxes/setup.sh"
    flock 8
  }
fi

# ---------------------------------------------------------------- 1. packages
packages=(bubblewrap libseccomp2)
[ "$mode" = podman ] && packages+=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs curl wordnet-base git python3-pytest)
# SWE-bench's harness runs the `docker` command (tests/envs/swe/test_swebench_harness.py): Podman's
# stands in for it where the machine has none
[ "$mode" = podman ] && ! command -v docker >/dev/null && packages+=(podman-docker)
command -v dpkg-query >/dev/null || die "no dpkg: install ${packages[*]} by hand"
mapfile -t absent < <(comm -23 <(printf '%s\n' "${packages[@]}" | sort) \
  <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${packages[@]}" 2>/dev/null | awk '$1 == "ii" { print $2 }' | sort))
if [ "${#absent[@]}" -gt 0 ]; then
  if [ "$root" = 1 ]; then
    log "installing ${absent[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q "${absent[@]}" >&2
  else
    missing+=("packages: ${absent[*]}")
  fi
else
  log "packages present: ${packages[*]}"
fi
if command -v bwrap >/dev/null; then
  error=$(bwrap --ro-bind / / --unshare-all --die-with-parent true 2>&1) ||
    die "bubblewrap is installed but cannot create its namespaces here: $error"
fi
if [ "$mode" = bwrap ] && [ "${#missing[@]}" = 0 ]; then
  exit 0
fi

# ---------------------------------------------------------------- 2. Podman configuration
changed=0
install_config() { # $1: path; content on stdin. Comment-only differences do not count as a change.
  local new
  new=$(cat)
  if [ -f "$1" ] && [ "$new" = "$(cat "$1")" ]; then
    return
  fi
  if [ "$root" = 0 ]; then
    missing+=("$1 (Podman's configuration)")
    return
  fi
  if [ ! -f "$1" ] || [ "$(grep -v '^#' <<<"$new")" != "$(grep -v '^#' "$1")" ]; then
    changed=1
  fi
  [ -f "$1" ] && cp -a "$1" "$1.bak.$(date +%s)"
  mkdir -p "$(dirname "$1")"
  printf '%s\n' "$new" >"$1"
  log "wrote $1"
}

if [ "$mode" = podman ]; then
  # runc applies every rlimit of the container's spec. Podman's defaults (nofile=1048576,
  # nproc=4194304) exceed the host's hard limits on some VMs, and without CAP_SYS_RESOURCE root
  # cannot raise them, so every container fails ("error setting rlimit type 7"). Clamp them.
  ulimits=""
  if ! prlimit --nofile=1048576:1048576 true 2>/dev/null; then
    nofile=$(ulimit -Hn)
    [ "$nofile" = unlimited ] && nofile=1048576
    nproc=$(cat /proc/sys/kernel/pid_max)
    # Podman's own RLIMIT_NPROC ends up at most pid_max, and 32768 where pid_max is larger.
    [ "$nproc" -gt 32768 ] && nproc=32768
    ulimits="default_ulimits = [
  \"nofile=$nofile:$nofile\",
  \"nproc=$nproc:$nproc\",
]"
  fi
  install_config /etc/containers/containers.conf <<EOF
$MARKER
[containers]
log_driver = "k8s-file"
$ulimits

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF

  # overlay when the kernel mounts it on the graph root (not when / is itself an overlay), else vfs.
  graphroot=/var/lib/containers/storage
  # The file may not exist yet (a fresh machine): read it only when it does.
  driver=""
  if [ -f /etc/containers/storage.conf ]; then
    driver=$(sed -n 's/^driver *= *"\(.*\)"/\1/p' /etc/containers/storage.conf | head -1)
  fi
  if [ -z "$driver" ] && [ "$root" = 1 ]; then
    mkdir -p "$graphroot"
    probe=$(mktemp -d "$graphroot/.overlay-probe.XXXXXX")
    mkdir -p "$probe"/{lower,upper,work,merged}
    driver=vfs
    if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
      umount "$probe/merged"
      driver=overlay
    fi
    rm -rf "$probe"
  fi
  install_config /etc/containers/storage.conf <<EOF
$MARKER
[storage]
driver = "${driver:-overlay}"
runroot = "/run/containers/storage"
graphroot = "$graphroot"
EOF

  # -------------------------------------------------------------- 3. the API service
  answers() { curl -sf --max-time 3 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }
  if [ "$changed" = 1 ] && answers; then
    if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "configuration changed: restarting the podman service"
      kill "$(cat "$PIDFILE")"
      for _ in $(seq 50); do
        kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
        sleep 0.1
      done
      rm -f "$PIDFILE"
    else
      log "warning: configuration changed, but this script did not start the running podman service: restart it"
    fi
  fi
  if answers; then
    log "podman service answers on $SOCK"
  elif [ "$root" = 0 ] && [ -S "$SOCK" ]; then
    missing+=("access to $SOCK for uid $(id -u): the socket is root's, so run the tests as root")
  elif [ "$root" = 0 ]; then
    missing+=("the podman service on $SOCK")
  else
    mkdir -p "$(dirname "$SOCK")"
    rm -f "$SOCK"
    # No systemd here: run it detached from this shell (and without our lock); --time=0 keeps it up.
    # From /: conmon writes an `oom` marker into its working directory when a container's memory
    # limit kills a process, which would otherwise land in the caller's checkout.
    (cd / && exec setsid nohup podman system service --time=0 "unix://$SOCK" >>"$SERVICE_LOG" 2>&1 </dev/null 8>&-) &
    echo $! >"$PIDFILE"
    for _ in $(seq 50); do
      answers && break
      sleep 0.2
    done
    answers || die "the podman service did not answer on $SOCK: see $SERVICE_LOG"
    log "podman service started (pid $(cat "$PIDFILE"), log $SERVICE_LOG)"
  fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
  for item in "${missing[@]}"; do log "missing: $item"; done
  [ "$mode" = bwrap ] && die "run \`sudo sandboxes/setup.sh --bwrap-only\`"
  die "run \`sudo sandboxes/setup.sh\`"
fi

# ---------------------------------------------------------------- 4. images
if [ "$mode" = engine ]; then
  CONTAINER_CLI=${CONTAINER_CLI:-docker} "$here/build.sh" "${build_args[@]}"
  echo "DOCKER_HOST=$DOCKER_HOST"
else
  "$here/build.sh" "${build_args[@]}"
  echo "DOCKER_HOST=unix://$SOCK"
fi
