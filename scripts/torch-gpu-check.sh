#!/usr/bin/env bash
# Run a torch image's on-GPU checks on any GPU host whose python3 has the manifest's torch:
# nccl-tests against the built libnccl (gpu_check.py), then a real torch job through that same
# library, arranged as the image arranges it, beside the wheel's own NCCL and the LD_PRELOAD
# trap (torch_gpu_check.py). The tarball is `scripts/gpu-bundle.sh MANIFEST OUT training`.
#
# Usage: scripts/torch-gpu-check.sh TREE_OR_TARBALL OUT_DIR [--gpus N]
# Writes OUT_DIR/nccl-tests.json and OUT_DIR/torch.json; exit 0 when every check passed.
# NVLink multicast is kept off (NCCL_NVLS_ENABLE=0) in every process.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 TREE_OR_TARBALL OUT_DIR [--gpus N]" >&2; exit 2; }
src=$1 out=$2
shift 2
gpus=1
[ "${1:-}" != --gpus ] || gpus=$2
if [ -f "$src" ]; then
    tree=$(mktemp -d /tmp/imageforge-gpu.XXXXXX)
    trap 'rm -rf "$tree"' EXIT
    tar -C "$tree" -xf "$src"
else
    tree=$src
fi
here=$(dirname "$0")
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
rc=0
# A wheel-provided NCCL travels as its sha256: the host's own wheel file fills it first.
python3 "$here/torch_gpu_check.py" --tree "$tree" --fill-wheel-nccl
python3 "$here/gpu_check.py" --tree "$tree" --json "$out/nccl-tests.json" --gpus "$gpus" || rc=1
python3 "$here/torch_gpu_check.py" --tree "$tree" --json "$out/torch.json" --gpus "$gpus" || rc=1
exit $rc
