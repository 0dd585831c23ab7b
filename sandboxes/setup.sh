#!/bin/bash
# DRAFT for issue 5 (sandboxes): tried by hand on a CI-like machine, not yet called by any
# project script or test. See sandboxes/FINDINGS.md.
#
# Idempotently install and configure rootful Podman as a Docker-compatible
# sandbox backend on a Debian 12 host WITHOUT Docker Engine and WITHOUT access
# to a container registry, build a local Python base image with debootstrap,
# and start the Docker-compatible API socket.
#
# Tested on: Debian 12 Firecracker VM, kernel 6.18, cgroup v1 (hybrid), root
# without CAP_SYS_RESOURCE, podman 4.3.1 / runc 1.1.5 / conmon 2.1.6.
#
# Usage:   sudo sandboxes/setup_podman.sh
# Env:     PODMAN_SOCK   socket path            (default /run/podman/podman.sock)
#          SANDBOX_IMAGE image to build          (default localhost/agentrl-python:latest)
#          DEBIAN_MIRROR debootstrap mirror      (default: first URI in /etc/apt/sources.list*)
#          BUILD_IMAGE=0 skip the image build
# Then:    export DOCKER_HOST=unix:///run/podman/podman.sock
#          python -c 'import docker; docker.from_env().ping()'
set -euo pipefail

SOCK=${PODMAN_SOCK:-/run/podman/podman.sock}
IMAGE=${SANDBOX_IMAGE:-localhost/agentrl-python:latest}
BUILD_IMAGE=${BUILD_IMAGE:-1}
SUITE=${DEBIAN_SUITE:-bookworm}
LOG=${PODMAN_SERVICE_LOG:-/var/log/podman-service.log}
PIDFILE=$(dirname "$SOCK")/podman-service.pid
PKGS=(podman runc uidmap slirp4netns fuse-overlayfs debootstrap bubblewrap curl)

log() { printf '[setup-podman] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

# ---------------------------------------------------------------- packages
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q "${missing[@]}"
else
  log "packages already installed"
fi

# ---------------------------------------------------------------- config
changed=0
install_if_changed() {  # $1 = target path; new content on stdin
  local tmp; tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 0; fi
  [ -f "$1" ] && cp -a "$1" "$1.bak.$(date +%s)"
  install -m 0644 "$tmp" "$1"; rm -f "$tmp"
  log "wrote $1"; changed=1
}

# rlimits: runc sets every rlimit in the spec. Podman's built-in defaults are
# nofile=1048576 and nproc=4194304; raising a hard limit needs CAP_SYS_RESOURCE,
# which some VMs/containers do not grant to root. Without it every container
# fails with "error setting rlimit type 7 (or 6): operation not permitted".
ulimits_block=""
if ! prlimit --nofile=1048576:1048576 true 2>/dev/null; then
  hn=$(ulimit -Hn); hu=$(ulimit -Hu); pm=$(cat /proc/sys/kernel/pid_max)
  [ "$hn" = unlimited ] && hn=1048576
  [ "$hu" = unlimited ] && hu=$pm
  nproc=$(( hu < pm ? hu : pm ))
  # podman itself clamps its own RLIMIT_NPROC (observed: 32768 == pid_max here)
  [ "$nproc" -gt 32768 ] && nproc=32768
  log "no CAP_SYS_RESOURCE: default_ulimits nofile=$hn nproc=$nproc"
  ulimits_block="default_ulimits = [
  \"nofile=$hn:$hn\",
  \"nproc=$nproc:$nproc\",
]"
fi

mkdir -p /etc/containers
install_if_changed /etc/containers/containers.conf <<EOF
# Managed by issue5_setup_podman.sh
[containers]
log_driver = "k8s-file"
$ulimits_block

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF

# storage driver: overlay if the kernel lets us mount overlayfs on the graph
# root (fails e.g. when / itself is overlayfs inside a container), else vfs.
graphroot=/var/lib/containers/storage
driver=""
if [ -f /etc/containers/storage.conf ]; then
  driver=$(sed -n 's/^driver *= *"\(.*\)"/\1/p' /etc/containers/storage.conf | head -1)
fi
if [ -z "$driver" ]; then
  mkdir -p "$graphroot"
  t=$(mktemp -d "$graphroot/.ovltest.XXXX")
  mkdir -p "$t"/{l,u,w,m}
  if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
    umount "$t/m"; driver=overlay
  else
    driver=vfs
  fi
  rm -rf "$t"
  log "storage driver: $driver"
fi
install_if_changed /etc/containers/storage.conf <<EOF
# Managed by issue5_setup_podman.sh
[storage]
driver = "$driver"
runroot = "/run/containers/storage"
graphroot = "$graphroot"
EOF

podman info --format '{{.Store.GraphDriverName}} cgroups={{.Host.CgroupsVersion}} runtime={{.Host.OCIRuntime.Name}}' >&2

# ---------------------------------------------------------------- base image
if [ "$BUILD_IMAGE" = 1 ] && ! podman image exists "$IMAGE"; then
  mirror=${DEBIAN_MIRROR:-$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
            | awk '{print $2}' | head -1 || true)}
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs=$(mktemp -d /var/tmp/agentrl-rootfs.XXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap $SUITE from $mirror (takes ~1-2 min)"
  debootstrap --variant=minbase --include=python3 "$SUITE" "$rootfs" "$mirror" >/var/log/agentrl-debootstrap.log 2>&1 \
    || { log "debootstrap failed, see /var/log/agentrl-debootstrap.log"; exit 1; }
  mkdir -p "$rootfs/work"
  tar -C "$rootfs" \
      --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
      --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' \
      --exclude='./usr/share/locale/*' --exclude='./usr/share/info/*' -c . \
    | podman import --change 'CMD ["/usr/bin/python3"]' --change 'WORKDIR /work' - "$IMAGE" >/dev/null
  rm -rf "$rootfs"; trap - EXIT
  log "imported $IMAGE"
fi
if podman image exists "$IMAGE"; then
  podman run --rm --network none --read-only --user 65534:65534 --memory 64m --pids-limit 16 \
    "$IMAGE" python3 -c 'print("sandbox smoke test ok")' >&2
fi

# ---------------------------------------------------------------- API service
ping() { curl -sf --max-time 3 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; }
stop_service() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")"
    for _ in $(seq 50); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$PIDFILE"
}
if [ "$changed" = 1 ] && ping; then
  if [ -f "$PIDFILE" ]; then
    log "config changed: restarting podman service"
    stop_service
  else
    log "WARNING: config changed but the running service was not started by this script; restart it by hand"
  fi
fi
if ! ping; then
  mkdir -p "$(dirname "$SOCK")"
  rm -f "$SOCK"
  # no systemd here: run detached; --time=0 = never exit on idle
  setsid nohup podman system service --time=0 "unix://$SOCK" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 50); do ping && break; sleep 0.2; done
  ping || { log "podman service did not come up; see $LOG"; exit 1; }
  log "podman service started (pid $(cat "$PIDFILE"), log $LOG)"
else
  log "podman service already answering on $SOCK"
fi
curl -s --unix-socket "$SOCK" http://d/v1.41/version | python3 -c \
  'import json,sys; v=json.load(sys.stdin); print("API", v["ApiVersion"], "podman", v["Version"])' >&2
echo "DOCKER_HOST=unix://$SOCK"
