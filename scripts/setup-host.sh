#!/usr/bin/env bash
# Make this machine ready for real Docker builds: Docker Engine + BuildKit + buildx + compose.
#
# Usage: scripts/setup-host.sh        (no arguments; idempotent)
#        APT_SAFE_SIMULATE=1 scripts/setup-host.sh
#                                     only simulate the apt step (what the tests run): prints the
#                                     packages it would add and exits 1 if any installed one
#                                     would change
#
# What it changes, and only when something is missing:
#   - docker buildx and a reachable daemon already there (e.g. Docker Desktop): nothing.
#   - engine/buildx/compose missing (bare Debian 12): adds the apt source
#     /etc/apt/sources.list.d/imageforge-trixie.sources (Debian trixie, same mirror) and the pin
#     /etc/apt/preferences.d/imageforge-trixie (priority 100: trixie is never chosen unless a
#     package names it), then installs docker.io, docker-buildx, containerd and docker-compose
#     from trixie, naming the release per package (bookworm's docker.io 20.10 has no buildx).
#     Every other new dependency comes from the machine's own release, and no installed package
#     changes version: the install is simulated first and refused if it would
#     (scripts/lib/apt-safe.sh).
#   - daemon installed but not running (no systemd): starts containerd then dockerd in the
#     background, logging to /var/log/imageforge-{containerd,dockerd}.log.
#   - sets features.containerd-snapshotter=true in /etc/docker/daemon.json, keeping its other
#     keys (the containerd image store lets the default buildx driver export cache).
#   - when daemon.json has no builder.gc of its own, sets builder.gc to enabled with
#     defaultKeepStorage $BUILDKIT_KEEP: without it dockerd runs BuildKit with no garbage
#     collection at all (moby/moby#49826), and its build cache grows until the disk is full.
#   Both take effect when dockerd starts: a daemon already running is left as it is.
set -euo pipefail
# shellcheck source=lib/apt-safe.sh
. "$(dirname "$0")/lib/apt-safe.sh"

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"   # dockerd/containerd live in sbin
DOCKERD_LOG=/var/log/imageforge-dockerd.log
CONTAINERD_LOG=/var/log/imageforge-containerd.log
DAEMON_JSON=/etc/docker/daemon.json
START_TIMEOUT=60
# BuildKit's cache beyond this is collected, least recently used first; imageforge keeps its
# artifacts in its own cache, not in BuildKit's. `make test` alone leaves 25 GB there (the
# real parts, the CUDA base and a torch wheel closure): at Docker Desktop's 20 GB BuildKit
# collected NCCL's layers between two runs, and the next compiled NCCL again (9 minutes).
BUILDKIT_KEEP=${BUILDKIT_KEEP:-40GB}

log() { echo "setup-host: $*"; }
die() { echo "setup-host: error: $*" >&2; exit 1; }
daemon_up() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root to $1"; }

# Debian mirror already configured for bookworm (deb822 or one-line format), else the default.
debian_mirror() {
    local m
    m=$(awk 'BEGIN { RS = "" }
             /(^|\n)Suites:([^\n]* )?bookworm( |\n|$)/ && match($0, /(^|\n)URIs:[ \t]*[^ \t\n]+/) {
                 n = split(substr($0, RSTART, RLENGTH), f, /[ \t\n]+/); print f[n]; exit }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$m" ] || m=$(awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++)
                              if ($i ~ /^https?:/) { print $i; exit } }' \
                       /etc/apt/sources.list 2>/dev/null || true)
    echo "${m:-http://deb.debian.org/debian}"
}

TRIXIE_PACKAGES=(docker.io/trixie docker-buildx/trixie containerd/trixie docker-compose/trixie)
SIMULATE=${APT_SAFE_SIMULATE:-0}

if [ "$SIMULATE" != 1 ] && docker buildx version >/dev/null 2>&1 && daemon_up; then
    log "docker $(docker info --format '{{.ServerVersion}}') with buildx already available; nothing to do"
    exit 0
fi

# --- 1. install what is missing -------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(dockerd)
command -v containerd >/dev/null || missing+=(containerd)
docker buildx version >/dev/null 2>&1 || missing+=(buildx)
docker compose version >/dev/null 2>&1 || missing+=(compose)

if [ "$SIMULATE" = 1 ]; then
    missing=(simulated)
fi
if [ ${#missing[@]} -gt 0 ]; then
    need_root "install ${missing[*]}"
    mirror=$(debian_mirror)
    release=$(. /etc/os-release; echo "${VERSION_CODENAME:-this release}")
    log "missing: ${missing[*]}. This will:"
    log "  add apt source /etc/apt/sources.list.d/imageforge-trixie.sources (trixie main from $mirror)"
    log "  add apt pin /etc/apt/preferences.d/imageforge-trixie (trixie at priority 100: used only when named)"
    log "  install ${TRIXIE_PACKAGES[*]}; their other new dependencies from $release; no installed package changes"
    log "  set features.containerd-snapshotter=true in $DAEMON_JSON and start containerd + dockerd"
    t0=$SECONDS
    cat > /etc/apt/sources.list.d/imageforge-trixie.sources <<EOF
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # Priority 100: a trixie package is installed only when named as PKG/trixie.
    cat > /etc/apt/preferences.d/imageforge-trixie <<EOF
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if [ "$SIMULATE" = 1 ]; then
        apt_safe_install "${TRIXIE_PACKAGES[@]}" && exit 0 || exit 1
    fi
    apt_safe_install "${TRIXIE_PACKAGES[@]}" || die "Docker was not installed (see above)"
    hash -r
    # An older docker client earlier on PATH may not search /usr/libexec/docker/cli-plugins;
    # every client since 19.03 searches /usr/local/lib/docker/cli-plugins.
    if ! docker buildx version >/dev/null 2>&1 || ! docker compose version >/dev/null 2>&1; then
        mkdir -p /usr/local/lib/docker/cli-plugins
        ln -sf /usr/libexec/docker/cli-plugins/docker-buildx /usr/local/lib/docker/cli-plugins/
        ln -sf /usr/libexec/docker/cli-plugins/docker-compose /usr/local/lib/docker/cli-plugins/
    fi
    docker buildx version >/dev/null 2>&1 || die "docker buildx still not found by $(command -v docker)"
    log "installed in $((SECONDS - t0)) s"
fi

# --- 2. containerd image store, BuildKit's garbage collection ---------------------------------
status=0
python3 "$(dirname "$0")/daemon_json.py" "$DAEMON_JSON" "$BUILDKIT_KEEP" || status=$?
case $status in
    0) log "set containerd-snapshotter and BuildKit's garbage collection in $DAEMON_JSON" ;;
    3) ;;
    *) exit 1 ;;
esac

# --- 3. start the daemons (no systemd) ----------------------------------------------------------
if ! daemon_up; then
    if [ "$(id -u)" != 0 ] && [ -S /var/run/docker.sock ]; then
        die "cannot talk to the daemon at /var/run/docker.sock as $(id -un) (not in the docker group?)"
    fi
    need_root "start dockerd"
    t0=$SECONDS
    # setsid: the daemons must outlive this script and the shell/session that ran it.
    if ! pgrep -x containerd >/dev/null; then
        log "starting containerd (log: $CONTAINERD_LOG)"
        setsid containerd >>"$CONTAINERD_LOG" 2>&1 < /dev/null &
    fi
    for _ in $(seq 1 $((START_TIMEOUT * 2))); do
        [ -S /run/containerd/containerd.sock ] && break
        sleep 0.5
    done
    [ -S /run/containerd/containerd.sock ] || die "containerd did not start; see $CONTAINERD_LOG"
    if ! pgrep -x dockerd >/dev/null; then
        log "starting dockerd (log: $DOCKERD_LOG)"
        setsid dockerd --containerd=/run/containerd/containerd.sock >>"$DOCKERD_LOG" 2>&1 < /dev/null &
    fi
    deadline=$((SECONDS + START_TIMEOUT))
    until daemon_up; do
        [ $SECONDS -lt $deadline ] || { tail -n 20 "$DOCKERD_LOG" >&2 || true
            die "dockerd did not answer 'docker info' within ${START_TIMEOUT} s; see $DOCKERD_LOG"; }
        sleep 0.5
    done
    log "daemon up in $((SECONDS - t0)) s"
fi

log "ready: client $(command -v docker) $(docker version --format '{{.Client.Version}}')," \
    "server $(docker info --format '{{.ServerVersion}}'), buildx $(docker buildx version | cut -d' ' -f2)"
