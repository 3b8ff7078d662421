#!/usr/bin/env bash
# Run the on-GPU checks on any GPU host, from an exported efa-nccl tree (scripts/gpu-bundle.sh
# makes one): versions against the pins, all_reduce_perf, sendrecv_perf, all_reduce_perf -o avg,
# #wrong on every row, the built aws-ofi-nccl failing over without EFA; with --gpus 2 also
# all_reduce across two GPUs in one process, two MPI ranks, and two ranks through the plugin.
#
# Usage: scripts/gpu-check.sh TREE_OR_TARBALL OUT.json [--gpus 2] [--max-bytes 256M]
# Needs python3, an NVIDIA driver and (for --gpus 2) Open MPI's mpirun. Exit 0 when every
# check passed. NVLink multicast is kept off (NCCL_NVLS_ENABLE=0).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 TREE_OR_TARBALL OUT.json [--gpus 2] [--max-bytes 256M]" >&2; exit 2; }
src=$1 out=$2
shift 2
if [ -f "$src" ]; then
    tree=$(mktemp -d /tmp/imageforge-gpu.XXXXXX)
    trap 'rm -rf "$tree"' EXIT
    tar -C "$tree" -xf "$src"
else
    tree=$src
fi
export NCCL_NVLS_ENABLE=0
exec python3 "$(dirname "$0")/gpu_check.py" --tree "$tree" --json "$out" "$@"
