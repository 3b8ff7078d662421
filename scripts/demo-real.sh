#!/usr/bin/env bash
# `make demo-real`: seed 000's image (EFA + NCCL + aws-ofi-nccl + nccl-tests) built by imageforge
# from real parts: real NCCL, nccl-tests and aws-ofi-nccl (full upstream history, served on
# 127.0.0.1:8742), a CUDA 13.0 devel base made from NVIDIA's wheels on PyPI, and Debian's real
# libfabric, rdma-core and Open MPI through the EFA installer stand-in. Then its image checks,
# and a second build that rebuilds nothing. Then the training image teams build today
# (manifests/real-pytorch.toml): torch 2.14.1 from its cu130 wheel, NCCL read "auto" from that
# wheel's pin (2.30.7, the same NCCL as above: its artifact is reused), the SageMaker toolkit.
#
# The full NCCL library takes 20-25 min on 2 cores, once: the artifact cache keeps it. The
# torch closure is about 3.5 GB from PyPI, once. ONLY_FUNCS="AllReduce Sum f32 * *" make
# demo-real builds only those kernels (about 6 min).
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=8742   # manifests/real-efa-nccl.toml points here
UPSTREAM=cache/real-upstream
MANIFEST=manifests/real-efa-nccl.toml
TRAINING=manifests/real-pytorch.toml
INVOKE=.venv/bin/invoke
EFA_VERSION=$(awk -F'"' '/^\[stages.efa\]/ { s = 1 } s && /^version/ { print $2; exit }' "$MANIFEST")
sets=()
[ -z "${ONLY_FUNCS:-}" ] || sets=(--set "stages.nccl.only_funcs=$ONLY_FUNCS")

step() { printf '\n== %s\n' "$*"; }

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "demo-real: port $PORT is already in use; stop whatever listens there" >&2
    exit 1
fi

step "CUDA 13.0 devel base from NVIDIA's wheels (scripts/cuda-base.sh)"
scripts/cuda-base.sh

step "real upstream sources in $UPSTREAM, and the EFA installer stand-in $EFA_VERSION"
scripts/real-upstream.sh "$UPSTREAM"
.venv/bin/python -m realparts efa-installer --version "$EFA_VERSION" --out "$UPSTREAM/files" \
    --deb-cache cache/sources/debs

step "serving them on http://127.0.0.1:$PORT"
.venv/bin/python -m sample serve --dir "$UPSTREAM" --port "$PORT" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.1
done

step "invoke lock (real release tags -> real commits)"
$INVOKE lock --manifest "$MANIFEST"

step "invoke check"
$INVOKE check --manifest "$MANIFEST" ${sets[@]+"${sets[@]}"}

step "invoke plan --target efa-nccl"
$INVOKE plan --target efa-nccl --manifest "$MANIFEST" ${sets[@]+"${sets[@]}"}

step "invoke build --target efa-nccl (then its image checks and versions report)"
time $INVOKE build --target efa-nccl --manifest "$MANIFEST" --locked --progress plain \
    ${sets[@]+"${sets[@]}"}

step "invoke build --target efa-nccl, again: nothing should rebuild"
time $INVOKE build --target efa-nccl --manifest "$MANIFEST" --locked --progress plain --no-test \
    ${sets[@]+"${sets[@]}"}

# The torch closure (5.6 GB) is written several times on its way into the image (pip, the
# stage's artifact, BuildKit's import of it, the image's COPY and export): one build ran out
# of disk with 36 GB free. Say so before starting rather than fail half-way.
NEED_GB=50
root=$(docker info --format '{{.DockerRootDir}}')
free_gb=$(( $(df --output=avail -k "$root" | tail -1) / 1024 / 1024 ))
if [ "$free_gb" -lt "$NEED_GB" ]; then
    echo "demo-real: the training image of $TRAINING needs about $NEED_GB GB free on Docker's disk ($root has $free_gb GB); the efa-nccl image above is built. Free space (docker builder prune) and run make demo-real again." >&2
    exit 1
fi

step "invoke lock --manifest $TRAINING (NCCL auto: the version torch's wheel pins)"
$INVOKE lock --manifest "$TRAINING"

step "invoke build --target training --manifest $TRAINING (then its image checks)"
time $INVOKE build --target training --manifest "$TRAINING" --locked --progress plain \
    ${sets[@]+"${sets[@]}"}
