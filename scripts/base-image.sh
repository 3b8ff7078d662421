#!/usr/bin/env bash
# Build the local Debian base image with debootstrap: nothing can be pulled from a registry here.
#
# Usage: scripts/base-image.sh [NAME:TAG]     (default imageforge/base:bookworm; idempotent)
#
# Does nothing when `docker image inspect NAME:TAG` finds the image. Otherwise debootstraps
# bookworm (minbase + the toolchain below) into a temp dir under /var/tmp and `docker import`s it.
# Needs root and a running daemon (scripts/setup-host.sh).
set -euo pipefail
# shellcheck source=lib/apt-safe.sh
. "$(dirname "$0")/lib/apt-safe.sh"

IMAGE=${1:-imageforge/base:bookworm}
SUITE=bookworm
PACKAGES=(
    build-essential make autoconf automake libtool pkg-config file
    python3 python3-dev python3-venv python3-pip python3-setuptools python3-wheel
    ca-certificates git curl wget openssh-client openssh-server jq
    hwloc libhwloc-dev libnuma1 libnuma-dev xz-utils bzip2
)

log() { echo "base-image: $*"; }
die() { echo "base-image: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# Bumped whenever the recipe below changes, so an older image of the same tag is rebuilt.
RECIPE=2
if [ "$(docker image inspect --format '{{ index .Config.Labels "io.imageforge.base-recipe" }}' \
        "$IMAGE" 2>/dev/null)" = "$RECIPE" ]; then
    log "$IMAGE already present; nothing to do"
    exit 0
fi
docker info >/dev/null 2>&1 || die "docker daemon not reachable (run scripts/setup-host.sh)"
[ "$(id -u)" = 0 ] || die "must run as root (debootstrap)"
export PATH="$PATH:/usr/sbin:/sbin"

# Same Debian mirror apt already uses for bookworm (deb822 or one-line format), else the default.
mirror=$(awk 'BEGIN { RS = "" }
              /(^|\n)Suites:([^\n]* )?bookworm( |\n|$)/ && match($0, /(^|\n)URIs:[ \t]*[^ \t\n]+/) {
                  n = split(substr($0, RSTART, RLENGTH), f, /[ \t\n]+/); print f[n]; exit }' \
         /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++)
                                      if ($i ~ /^https?:/) { print $i; exit } }' \
                             /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    # From this machine's own release; refused if any installed package would change.
    apt-get update -qq
    apt_safe_install debootstrap || die "debootstrap was not installed (see above)"
fi

work=$(mktemp -d /var/tmp/imageforge-base.XXXXXX)
child=
cleanup() {
    if [ -n "$child" ]; then kill -TERM -- "-$child" 2>/dev/null || true; wait "$child" || true; fi
    # debootstrap may leave /proc, /sys, ... mounted inside the rootfs when it fails.
    awk -v d="$work/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT    # make INT/TERM go through the EXIT trap too
trap 'exit 143' TERM

t_all=$(now)
log "debootstrap $SUITE from $mirror into $work/rootfs"
t=$(now)
include=$(IFS=,; echo "${PACKAGES[*]}")
# Run in the background in its own process group (set -m) so that a TERM/INT sent to this
# script is handled at once and the cleanup can stop debootstrap and its chrooted dpkg runs.
set -m
debootstrap --variant=minbase --include="$include" "$SUITE" "$work/rootfs" "$mirror" \
    > "$work/debootstrap.log" 2>&1 &
child=$!
set +m
wait "$child" || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
child=
log "debootstrap done in $(since "$t")"

# apt caches and package lists are useless in the image; `apt-get update` restores the lists.
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin \
       "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/log/*.log
mkdir -p "$work/rootfs/var/lib/apt/lists/partial"
# openssh-server made host keys while it was installed: every container of every image built
# on this one would share them. Images make their own when a container starts.
rm -f "$work"/rootfs/etc/ssh/ssh_host_*
rootfs_mb=$(du -smx "$work/rootfs" | cut -f1)

log "importing as $IMAGE"
t=$(now)
# --numeric-owner: file owners are the rootfs' own uids/gids, not whatever the host names them.
tar --numeric-owner -C "$work/rootfs" -c . |
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        --change "LABEL io.imageforge.base-recipe=$RECIPE" \
        --message "debootstrap --variant=minbase $SUITE" \
        - "$IMAGE" >/dev/null
log "import done in $(since "$t")"

layer=$(docker image inspect --format '{{.Size}}' "$IMAGE")   # compressed layer size
log "built $IMAGE (rootfs $rootfs_mb MiB, compressed $((layer / 1024 / 1024)) MiB) in $(since "$t_all")"
