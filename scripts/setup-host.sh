#!/usr/bin/env bash
# Make this machine ready for real Docker builds: Docker Engine + BuildKit + buildx + compose.
#
# Usage: scripts/setup-host.sh        (no arguments; idempotent)
#
#   - docker buildx and a reachable daemon already there (e.g. Docker Desktop): does nothing.
#   - engine/buildx/compose missing (bare Debian 12): installs them from Debian trixie, pinned so
#     nothing else gets upgraded (bookworm's docker.io 20.10 has no buildx).
#   - daemon installed but not running (no systemd): starts containerd then dockerd in the
#     background, logging to /var/log/imageforge-{containerd,dockerd}.log.
#   - enables the containerd image store in /etc/docker/daemon.json (needed by the default
#     buildx driver for cache export).
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"   # dockerd/containerd live in sbin
DOCKERD_LOG=/var/log/imageforge-dockerd.log
CONTAINERD_LOG=/var/log/imageforge-containerd.log
DAEMON_JSON=/etc/docker/daemon.json
START_TIMEOUT=60

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

if docker buildx version >/dev/null 2>&1 && daemon_up; then
    log "docker $(docker info --format '{{.ServerVersion}}') with buildx already available; nothing to do"
    exit 0
fi

# --- 1. install what is missing -------------------------------------------------------------
missing=()
command -v dockerd >/dev/null || missing+=(dockerd)
command -v containerd >/dev/null || missing+=(containerd)
docker buildx version >/dev/null 2>&1 || missing+=(buildx)
docker compose version >/dev/null 2>&1 || missing+=(compose)

if [ ${#missing[@]} -gt 0 ]; then
    need_root "install ${missing[*]}"
    mirror=$(debian_mirror)
    log "installing docker.io docker-buildx containerd docker-compose from trixie ($mirror; missing: ${missing[*]})"
    t0=$SECONDS
    cat > /etc/apt/sources.list.d/imageforge-trixie.sources <<EOF
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # Priority 100: trixie packages are only used when asked for with -t trixie.
    cat > /etc/apt/preferences.d/imageforge-trixie <<EOF
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq -t trixie docker.io docker-buildx containerd docker-compose >/dev/null
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

# --- 2. containerd image store ----------------------------------------------------------------
if ! python3 - "$DAEMON_JSON" <<'EOF'
import json, os, sys
path = sys.argv[1]
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
sys.exit(0 if cfg.get("features", {}).get("containerd-snapshotter") is True else 1)
EOF
then
    need_root "write $DAEMON_JSON"
    python3 - "$DAEMON_JSON" <<'EOF'
import json, os, sys
path = sys.argv[1]
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
cfg.setdefault("features", {})["containerd-snapshotter"] = True   # keep all other keys
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
EOF
    log "enabled containerd-snapshotter in $DAEMON_JSON"
fi

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
