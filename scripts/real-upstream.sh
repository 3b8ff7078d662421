#!/usr/bin/env bash
# Prepare the real upstream sources for serving on 127.0.0.1, as `python -m sample serve` does
# for the sample: DIR/git/<name>.git are bare mirrors of the real NVIDIA/nccl, NVIDIA/nccl-tests
# and aws/aws-ofi-nccl repositories (full history, from git bundles), DIR/files/ holds the EFA
# installer stand-in (realparts/, Debian's real libfabric, rdma-core and Open MPI).
#
# Usage: scripts/real-upstream.sh [DIR]    (default cache/real-upstream; idempotent)
# The bundles are read from $IMAGEFORGE_UPSTREAM_BUNDLES (default: shared/upstream in this
# checkout, else ../shared/upstream beside it); they are only read, never written.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-cache/real-upstream}
# shared/upstream inside the checkout, else beside it.
if [ -n "${IMAGEFORGE_UPSTREAM_BUNDLES:-}" ]; then
    BUNDLES=$IMAGEFORGE_UPSTREAM_BUNDLES
elif [ -d shared/upstream ]; then
    BUNDLES=shared/upstream
else
    BUNDLES=../shared/upstream
fi
log() { echo "real-upstream: $*"; }
die() { echo "real-upstream: error: $*" >&2; exit 1; }

mkdir -p "$DIR/git" "$DIR/files"
for name in nccl nccl-tests aws-ofi-nccl; do
    bundle=$BUNDLES/$name.bundle
    repo=$DIR/git/$name.git
    [ -f "$bundle" ] || die "$bundle is missing: set IMAGEFORGE_UPSTREAM_BUNDLES to the folder with nccl.bundle, nccl-tests.bundle and aws-ofi-nccl.bundle"
    if [ ! -d "$repo" ]; then
        log "mirroring $bundle into $repo"
        git clone --quiet --mirror "$bundle" "$repo.part"
        mv "$repo.part" "$repo"
    fi
done
log "ready: $DIR (serve it with: .venv/bin/python -m sample serve --dir $DIR --port 8742)"
