#!/usr/bin/env bash
# Make the tarball a GPU host needs to run what imageforge built outside containers: the
# files of the efa-nccl target (invoke build --output), plus in deps/lib the non-system
# libraries they load (libfabric's rdma-core, libnl, ...), taken from the built image.
# glibc, the C++ runtime, the CUDA driver and Open MPI come from the GPU host (Open MPI 4.1
# keeps the libmpi.so.40 ABI; its plugins live at the host's own paths).
#
# Usage: scripts/gpu-bundle.sh MANIFEST OUT.tar.xz    (after `invoke build --target efa-nccl`)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 MANIFEST OUT.tar.xz" >&2; exit 2; }
manifest=$1 out=$2
tree=$(mktemp -d /var/tmp/imageforge-bundle.XXXXXX)
trap 'rm -rf "$tree"' EXIT
rmdir "$tree"
image=imageforge/gpu-bundle:efa-nccl
.venv/bin/invoke build --target efa-nccl --manifest "$manifest" --locked --no-test \
    --progress plain --tag "$image" --output "$tree"
mkdir -p "$tree/deps/lib"
docker run --rm -v "$tree:/export" "$image" bash -c '
    set -euo pipefail
    skip="^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+|libcuda|libnvidia|libmpi|libopen-rte|libopen-pal|libpmix|libhwloc|libevent|libz)\."
    find /export -type f \( -name "*.so*" -o -perm -u+x \) ! -path "/export/deps/*" -print0 |
        { xargs -0 -n 20 ldd 2>/dev/null || true; } | awk "/=> \\// { print \$3 }" | sort -u |
        while read -r lib; do
            name=${lib##*/}
            [[ $name =~ $skip ]] && continue
            [ -n "$(find /export -name "$name" ! -path "/export/deps/*" -print -quit)" ] && continue
            cp -L "$lib" /export/deps/lib/
        done
    ls /export/deps/lib'
tar -C "$tree" -cf - . | xz -T0 -6 > "$out.part"
mv "$out.part" "$out"
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1))"
