#!/usr/bin/env bash
# Make the tarball a GPU host needs to run what imageforge built outside containers: the
# files of an image target (invoke build --output; efa-nccl unless named), plus in deps/lib the
# non-system libraries they load (libfabric's rdma-core, libnl, ...), taken from the built
# image. glibc, the C++ runtime, the CUDA driver and Open MPI come from the GPU host (Open MPI
# 4.1 keeps the libmpi.so.40 ABI; its plugins live at the host's own paths).
#
# A torch image (the training target) is bundled without its Python tree: the GPU host brings
# its own torch of the same release (scripts/torch_gpu_check.py checks that), and of
# site-packages only the image's nvidia/nccl/lib/libnccl.so.2 link to the built library is kept.
#
# Usage: scripts/gpu-bundle.sh MANIFEST OUT.tar.xz [TARGET]
# EXPORTED=DIR takes the files from an earlier `invoke build --target TARGET --tag
# imageforge/gpu-bundle:TARGET --output DIR` instead of building again (a torch image's export
# is several GB); ONLY_FUNCS=... is passed to the nccl stage as in `make demo-real`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 MANIFEST OUT.tar.xz [TARGET]" >&2; exit 2; }
manifest=$1 out=$2 target=${3:-efa-nccl}
tree=$(mktemp -d /var/tmp/imageforge-bundle.XXXXXX)
trap 'rm -rf "$tree"' EXIT
rmdir "$tree"
image=imageforge/gpu-bundle:$target
if [ -n "${EXPORTED:-}" ]; then
    mkdir "$tree"
    tar -C "$EXPORTED" --exclude=./opt/conda -cf - . | tar -C "$tree" -xf -
    for site in "$EXPORTED"/opt/conda/lib/python*/site-packages; do
        link=${site#"$EXPORTED"/}/nvidia/nccl/lib/libnccl.so.2
            if [ -L "$EXPORTED/$link" ]; then
            tar -C "$EXPORTED" -cf - "$link" | tar -C "$tree" -xf -
        fi
    done
else
    .venv/bin/invoke build --target "$target" --manifest "$manifest" --locked --no-test \
        --progress plain --tag "$image" --output "$tree" \
        ${ONLY_FUNCS:+--set "stages.nccl.only_funcs=$ONLY_FUNCS"}
fi
for site in "$tree"/opt/conda/lib/python*/site-packages; do
    [ -d "$site" ] || continue
    link=$site/nvidia/nccl/lib/libnccl.so.2
    [ -L "$link" ] || { echo "gpu-bundle: $link is not the image's link" >&2; exit 1; }
    mv "$link" "$tree/nccl-link"
    rm -rf "$tree/opt/conda"
    mkdir -p "${link%/*}"
    mv "$tree/nccl-link" "$link"
done
# An NCCL from the wheel (`[stages.nccl] provider = "wheel"`) is the wheel's own file, byte for
# byte: its hundreds of MB stay out of the tarball, and in its place goes a record of its
# sha256 (libnccl.so.V.sha256), which torch_gpu_check.py fills from the GPU host's own
# nvidia-nccl wheel of the same release, only when the sha256 is the same.
python3 - "$tree" <<'PY'
import hashlib, json, pathlib, sys
tree = pathlib.Path(sys.argv[1])
stages = json.loads((tree / "imageforge-export.json").read_text())["stages"]
nccl = next((s["inputs"] for s in stages if s["name"] == "nccl"), {})
if nccl.get("provider") == "wheel":
    lib = tree / nccl["prefix"].lstrip("/") / "lib" / f"libnccl.so.{nccl['version']}"
    digest = hashlib.sha256(lib.read_bytes()).hexdigest()
    lib.with_name(lib.name + ".sha256").write_text(f"{digest}  {lib.name}\n")
    lib.unlink()
    print(f"gpu-bundle: {lib.name} (NCCL wheel) left out, sha256 {digest[:16]}...")
PY
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
