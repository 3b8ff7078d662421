#!/bin/bash
# EFA installer (sample). Same command line as the AWS EFA installer; instead of installing
# packages it compiles the bundled sources with gcc and installs:
#   /opt/amazon/efa       libfabric @@LIBFABRIC_VERSION@@ (lib/, include/rdma/, bin/fi_info)
#   /opt/amazon/openmpi   Open MPI @@OMPI_VERSION@@ (lib/libmpi.so*, include/mpi.h, bin/mpicc, mpirun, ompi_info)
# and /opt/amazon/efa_installed_packages, /etc/ld.so.conf.d/efa.conf.
# EFA_INSTALL_ROOT (default /) installs under another root; only tests use it.
set -euo pipefail

readonly VERSION="@@EFA_VERSION@@"
readonly LIBFABRIC_VERSION="@@LIBFABRIC_VERSION@@"
readonly OMPI_VERSION="@@OMPI_VERSION@@"
readonly SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/src"

ROOT="${EFA_INSTALL_ROOT:-/}"
ROOT="${ROOT%/}"
EFA_PREFIX="$ROOT/opt/amazon/efa"
MPI_PREFIX="$ROOT/opt/amazon/openmpi"

yes=no
skip_kmod=no
enable_gdr=no
skip_limit_conf=no
no_verify=no
debug_packages=no
minimal=no
uninstall=no
BUILD_DIR=""

usage() {
	cat <<USAGE
Usage: $0 [options]
Options:
  -y, --yes               Do not prompt before installing
  -k, --skip-kmod         Skip installing the EFA kernel module
  -g, --enable-gdr        Install the GPUDirect RDMA capable libfabric
  -l, --skip-limit-conf   Do not set memlock limits in /etc/security/limits.d
  -n, --no-verify         Skip the post-install check
  -d, --debug-packages    Also install debug information
  -m, --minimal           Only install the kernel module and rdma-core (no libfabric, no Open MPI)
  -u, --uninstall         Remove what a previous run installed
  -h, --help              Show this help
USAGE
}

die() {
	echo "Error: $*" >&2
	exit 1
}

parse_args() {
	while [ $# -gt 0 ]; do
		case "$1" in
		-y|--yes) yes=yes ;;
		-k|--skip-kmod) skip_kmod=yes ;;
		-g|--enable-gdr) enable_gdr=yes ;;
		-l|--skip-limit-conf) skip_limit_conf=yes ;;
		-n|--no-verify) no_verify=yes ;;
		-d|--debug-packages) debug_packages=yes ;;
		-m|--minimal) minimal=yes ;;
		-u|--uninstall) uninstall=yes ;;
		-h|--help) usage; exit 0 ;;
		*) echo "Unknown option: $1" >&2; usage >&2; exit 1 ;;
		esac
		shift
	done
}

confirm() {
	if [ "$yes" = yes ]; then
		return
	fi
	local answer=""
	read -r -p "Install EFA installer $VERSION components under ${ROOT:-/}? [y/N] " answer || true
	case "$answer" in
	y|Y|yes|YES) ;;
	*) die "installation not confirmed (pass -y to install without prompting)" ;;
	esac
}

check_prerequisites() {
	if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
		die "this script must be run as root"
	fi
	command -v gcc >/dev/null 2>&1 || die "gcc not found: install build-essential first"
}

cflags() {
	if [ "$debug_packages" = yes ]; then echo "-O2 -g"; else echo "-O2"; fi
}

# libfabric.so.1.<minor>.<revision>, with the usual .so.1 and .so links.
build_libfabric() {
	local build="$1" so="libfabric.so.1.${LIBFABRIC_VERSION#*.}"
	echo "== Installing libfabric $LIBFABRIC_VERSION =="
	# shellcheck disable=SC2046 # cflags is a list of flags
	gcc $(cflags) -Wall -fPIC -shared -Wl,-soname,libfabric.so.1 \
		-I"$SRC_DIR/libfabric/include" -o "$build/$so" "$SRC_DIR/libfabric/fabric.c"
	ln -sf "$so" "$build/libfabric.so.1"
	ln -sf libfabric.so.1 "$build/libfabric.so"
	# shellcheck disable=SC2046
	gcc $(cflags) -Wall -I"$SRC_DIR/libfabric/include" -o "$build/fi_info" \
		"$SRC_DIR/libfabric/fi_info.c" -L"$build" -lfabric -Wl,-rpath,'$ORIGIN/../lib'
	install -d "$EFA_PREFIX/lib" "$EFA_PREFIX/include/rdma" "$EFA_PREFIX/bin"
	install -m 0755 "$build/$so" "$EFA_PREFIX/lib/"
	cp -P "$build/libfabric.so.1" "$build/libfabric.so" "$EFA_PREFIX/lib/"
	install -m 0644 "$SRC_DIR/libfabric/include/rdma/"*.h "$EFA_PREFIX/include/rdma/"
	install -m 0755 "$build/fi_info" "$EFA_PREFIX/bin/"
}

# libmpi.so.40.30.<release> as in Open MPI 4.1, plus the wrappers and ompi_info.
build_openmpi() {
	local build="$1" so="libmpi.so.40.30.@@OMPI_RELEASE@@"
	echo "== Installing Open MPI $OMPI_VERSION =="
	# shellcheck disable=SC2046
	gcc $(cflags) -Wall -fPIC -shared -Wl,-soname,libmpi.so.40 \
		-I"$SRC_DIR/openmpi/include" -o "$build/$so" "$SRC_DIR/openmpi/mpi.c"
	ln -sf "$so" "$build/libmpi.so.40"
	ln -sf libmpi.so.40 "$build/libmpi.so"
	# shellcheck disable=SC2046
	gcc $(cflags) -Wall -I"$SRC_DIR/openmpi/include" -o "$build/ompi_info" \
		"$SRC_DIR/openmpi/ompi_info.c" -L"$build" -lmpi -Wl,-rpath,'$ORIGIN/../lib'
	install -d "$MPI_PREFIX/lib" "$MPI_PREFIX/include" "$MPI_PREFIX/bin"
	install -m 0755 "$build/$so" "$MPI_PREFIX/lib/"
	cp -P "$build/libmpi.so.40" "$build/libmpi.so" "$MPI_PREFIX/lib/"
	install -m 0644 "$SRC_DIR/openmpi/include/mpi.h" "$MPI_PREFIX/include/"
	install -m 0755 "$build/ompi_info" "$SRC_DIR/openmpi/mpicc" "$SRC_DIR/openmpi/mpirun" "$MPI_PREFIX/bin/"
	ln -sf mpirun "$MPI_PREFIX/bin/mpiexec"
}

write_system_config() {
	install -d "$ROOT/etc/ld.so.conf.d"
	echo "/opt/amazon/efa/lib" > "$ROOT/etc/ld.so.conf.d/efa.conf"
	if [ "$skip_limit_conf" = no ]; then
		install -d "$ROOT/etc/security/limits.d"
		printf '* soft memlock unlimited\n* hard memlock unlimited\n' > "$ROOT/etc/security/limits.d/efa.conf"
	fi
	if [ -z "$ROOT" ] && command -v ldconfig >/dev/null 2>&1; then
		ldconfig
	fi
}

write_package_list() {
	local gdr_suffix="" packages="ibverbs-providers rdma-core"
	if [ "$enable_gdr" = yes ]; then gdr_suffix="+gdr"; fi
	if [ "$skip_kmod" = no ]; then packages="efa-kmod $packages"; fi
	if [ "$minimal" = no ]; then
		packages="$packages libfabric-aws-$LIBFABRIC_VERSION$gdr_suffix openmpi40-aws-$OMPI_VERSION"
	fi
	install -d "$ROOT/opt/amazon"
	{
		echo "# EFA installer version: $VERSION"
		echo "# Debug packages installed: $debug_packages"
		echo "# GPUDirect RDMA enabled: $enable_gdr"
		echo "# Packages installed:"
		for package in $packages; do echo "$package"; done
	} > "$ROOT/opt/amazon/efa_installed_packages"
}

verify() {
	if [ "$no_verify" = yes ] || [ "$minimal" = yes ]; then
		return
	fi
	echo "== Testing EFA device =="
	echo "No EFA device in this environment; checking that libfabric loads."
	"$EFA_PREFIX/bin/fi_info" --version
}

uninstall_all() {
	rm -rf "$EFA_PREFIX" "$MPI_PREFIX" "$ROOT/opt/amazon/efa_installed_packages" \
		"$ROOT/etc/ld.so.conf.d/efa.conf" "$ROOT/etc/security/limits.d/efa.conf"
	echo "EFA components removed."
}

main() {
	parse_args "$@"
	check_prerequisites
	if [ "$uninstall" = yes ]; then
		confirm
		uninstall_all
		return
	fi
	confirm
	echo "== EFA installer $VERSION =="
	if [ "$skip_kmod" = yes ]; then
		echo "Skipping the EFA kernel module (--skip-kmod)."
	else
		echo "No kernel module is built by this installer; continuing with user space components."
	fi
	BUILD_DIR=$(mktemp -d)
	trap 'rm -rf "${BUILD_DIR:-}"' EXIT
	if [ "$minimal" = no ]; then
		build_libfabric "$BUILD_DIR"
		build_openmpi "$BUILD_DIR"
	fi
	write_system_config
	write_package_list
	verify
	echo "==================================================="
	echo "EFA installation complete."
	echo "- Please logout/login to complete the installation."
	echo "- Libfabric was installed in /opt/amazon/efa"
	echo "- Open MPI was installed in /opt/amazon/openmpi"
	echo "==================================================="
}

main "$@"
