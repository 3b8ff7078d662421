#!/usr/bin/env bash
# Build a CUDA 13.0 devel base image with no container registry: the debootstrapped base plus
# NVIDIA's CUDA wheels from PyPI, pinned by version and sha256 in scripts/cuda/cuda-13.0.pins,
# laid out as nvidia/cuda:13.0-devel (see scripts/cuda/Dockerfile).
#
# Usage: scripts/cuda-base.sh [NAME:TAG]    (default imageforge/cuda:13.0-devel-bookworm; idempotent)
#
# The wheels are downloaded on the host into cache/sources/cuda-wheels (verified, kept), so a
# rebuild or an air-gapped machine with that folder needs no network. Does nothing when the
# image exists with the label of this exact recipe (pins + Dockerfile). Needs the base image
# (scripts/base-image.sh) and a running daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-imageforge/cuda:13.0-devel-bookworm}
BASE=${BASE_IMAGE:-imageforge/base:bookworm}
PINS=scripts/cuda/cuda-13.0.pins
WHEELS=cache/sources/cuda-wheels

log() { echo "cuda-base: $*"; }
die() { echo "cuda-base: error: $*" >&2; exit 1; }

recipe=$(cat "$PINS" scripts/cuda/Dockerfile <(echo "$BASE") | sha256sum | cut -c1-16)
if [ "$(docker image inspect --format '{{ index .Config.Labels "io.imageforge.cuda-recipe" }}' \
        "$IMAGE" 2>/dev/null)" = "$recipe" ]; then
    log "$IMAGE already present; nothing to do"
    exit 0
fi
docker image inspect "$BASE" >/dev/null 2>&1 || die "base image $BASE is missing (run scripts/base-image.sh)"

mkdir -p "$WHEELS"
ctx=$(mktemp -d /var/tmp/imageforge-cuda.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir "$ctx/wheels"
nccl_version=
while read -r name version url sha256; do
    case "$name" in ''|'#'*) continue ;; esac
    file=$WHEELS/${url##*/}
    if [ ! -f "$file" ] || ! echo "$sha256  $file" | sha256sum -c --status; then
        log "downloading $name $version"
        curl -fsSL --retry 4 --retry-delay 2 -o "$file.part" "$url" ||
            { rm -f "$file.part"; die "could not download $name $version from $url; check the network or put the wheel in $WHEELS"; }
        echo "$sha256  $file.part" | sha256sum -c --status ||
            { rm -f "$file.part"; die "$name $version from $url does not match its sha256 in $PINS"; }
        mv "$file.part" "$file"
    fi
    ln "$file" "$ctx/wheels/" 2>/dev/null || cp "$file" "$ctx/wheels/"
    [ "$name" = nvidia-nccl-cu13 ] && nccl_version=$version
done < "$PINS"
[ -n "$nccl_version" ] || die "$PINS names no nvidia-nccl-cu13 wheel"
cuda_version=$(awk '$1 == "nvidia-cuda-runtime" { print $2 }' "$PINS")

log "building $IMAGE (CUDA $cuda_version, distro NCCL $nccl_version) on $BASE"
t0=$SECONDS
docker buildx build --load --progress plain \
    --build-arg "BASE=$BASE" --build-arg "CUDA_VERSION=$cuda_version" \
    --build-arg "NCCL_VERSION=$nccl_version" \
    --label "io.imageforge.cuda-recipe=$recipe" \
    -t "$IMAGE" -f scripts/cuda/Dockerfile "$ctx" 2>&1 | grep -E '^#[0-9]+ (DONE|ERROR)|Cuda compilation|release|ERROR|error' || true
docker image inspect "$IMAGE" --format '{{ index .Config.Labels "io.imageforge.cuda-recipe" }}' 2>/dev/null |
    grep -qx "$recipe" || die "building $IMAGE failed (run: docker buildx build -f scripts/cuda/Dockerfile for the full log)"
log "built $IMAGE in $((SECONDS - t0)) s"
