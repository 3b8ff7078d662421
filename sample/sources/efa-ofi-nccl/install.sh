#!/bin/bash
# aws-ofi-nccl @@OFI_NCCL_VERSION@@ as the EFA installer ships it (sample): compiled from the
# sources beside this script against the libfabric the installer just installed, into
# /opt/amazon/ofi-nccl/@@OFI_NCCL_DIR@@. The real installer's directory differs between its
# releases and between operating systems, which is why imageforge looks the plugin up rather
# than assuming a path. Usage: install.sh BUILD_DIR EFA_PREFIX PLUGIN_PREFIX CFLAGS
set -euo pipefail

readonly SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$1" efa_prefix="$2" prefix="$3" cflags="$4"
libdir="$prefix/@@OFI_NCCL_DIR@@"

echo "== Installing aws-ofi-nccl @@OFI_NCCL_VERSION@@ =="
# A weak ncclGetVersion: the plugin links no libnccl, so a process that dlopens it without
# NCCL (a check, ldd -r) still binds every symbol; inside NCCL, NCCL's own one is found first.
cat > "$build/nccl_version_weak.c" <<'WEAK'
#include "nccl.h"
__attribute__((weak)) ncclResult_t ncclGetVersion(int *version) { *version = 0; return ncclInvalidUsage; }
WEAK
# shellcheck disable=SC2086 # cflags is a list of flags
gcc $cflags -Wall -fPIC -shared -Wl,-soname,libnccl-net-ofi.so -I"$SRC" -I"$efa_prefix/include" \
	-o "$build/libnccl-net-ofi.so" "$SRC/nccl_ofi_net.c" "$SRC/nccl_ofi_loopback.c" \
	"$build/nccl_version_weak.c" -L"$efa_prefix/lib" -lfabric -lpthread
install -d "$libdir"
install -m 0755 "$build/libnccl-net-ofi.so" "$libdir/"
# The name NCCL dlopens when NCCL_NET_PLUGIN is unset.
ln -sf libnccl-net-ofi.so "$libdir/libnccl-net.so"
