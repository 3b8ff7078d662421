#!/bin/bash
# EFA installer STAND-IN, version @@EFA_VERSION@@ (made by `python -m realparts efa-installer`).
#
# The real AWS EFA installer is a download from AWS's S3 bucket, which cannot be reached where
# imageforge is built and tested. This script has the real installer's command line and puts
# real fabric libraries where the real one puts them, from the Debian 12 packages bundled
# beside it in DEBS/DEBIAN12/x86_64 (a local apt repository; no network needed):
#   /opt/amazon/efa        libfabric (lib/libfabric.so*, include/rdma/, bin/fi_info ...): copies
#                          of the files of Debian's libfabric1, libfabric-dev, libfabric-bin
#   /opt/amazon/openmpi    Open MPI: bin/, include/, lib/ are links into Debian's Open MPI
#                          (/usr/bin, /usr/lib/x86_64-linux-gnu/openmpi)
#   /usr/lib/...           rdma-core: libibverbs, librdmacm, libefa (ibverbs-providers)
#   /etc/ld.so.conf.d/efa.conf, /etc/security/limits.d/efa.conf, /opt/amazon/efa_installed_packages
# What differs from the real installer:
#   - no EFA kernel module (containers never build it; the real one needs --skip-kmod there too);
#   - libfabric is Debian's 1.17 without AWS's patches (no "amzn" version suffix), so the efa
#     provider is the upstream one, and it is built without CUDA memory support (FI_HMEM_CUDA),
#     so no GPUDirect RDMA: -g is accepted and changes nothing;
#   - Open MPI is Debian's 4.1.4, not AWS's build, and /opt/amazon/openmpi holds links to it;
#   - Debian 12 only; -d/--debug-packages is accepted but installs nothing more (Debian's
#     debug symbols live in a separate archive); -u/--uninstall is not implemented.
set -euo pipefail

readonly EFA_VERSION="@@EFA_VERSION@@"
DEB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/DEBS/DEBIAN12/x86_64"
readonly DEB_DIR
readonly MULTIARCH=/usr/lib/x86_64-linux-gnu
readonly EFA_PREFIX=/opt/amazon/efa
readonly MPI_PREFIX=/opt/amazon/openmpi
readonly RDMA_PACKAGES="rdma-core ibverbs-providers libibverbs1 libibverbs-dev librdmacm1 librdmacm-dev"
readonly FABRIC_PACKAGES="libfabric1 libfabric-bin libfabric-dev openmpi-bin libopenmpi-dev"

yes=no
skip_kmod=no
enable_gdr=no
skip_limit_conf=no
no_verify=no
debug_packages=no
minimal=no

usage() {
	cat <<USAGE
Usage: $0 [options]
EFA installer stand-in $EFA_VERSION: Debian 12's libfabric, rdma-core and Open MPI, laid out
as the AWS EFA installer lays them out (see the header of this script for the differences).
Options:
  -y, --yes               Do not prompt before installing
  -k, --skip-kmod         Skip the EFA kernel module (this stand-in never installs one)
  -g, --enable-gdr        Accepted for compatibility: Debian's libfabric has no separate GDR build
  -l, --skip-limit-conf   Do not set memlock limits in /etc/security/limits.d
  -n, --no-verify         Skip the post-install check
  -d, --debug-packages    Accepted for compatibility: no debug packages are bundled
  -m, --minimal           Only install rdma-core (no libfabric, no Open MPI)
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
		-h|--help) usage; exit 0 ;;
		*) echo "Unknown option: $1" >&2; usage >&2; exit 1 ;;
		esac
		shift
	done
}

check_system() {
	[ "$(id -u)" -eq 0 ] || die "this script must be run as root"
	local system
	# A subshell: os-release's variables (VERSION among them) must not leak into this script.
	# shellcheck disable=SC1091 # the OS's own file
	system=$(. /etc/os-release && echo "${ID:-unknown}-${VERSION_ID:-}-$(dpkg --print-architecture)")
	if [ "$system" != debian-12-amd64 ]; then
		die "unsupported system $system: this stand-in bundles packages for Debian 12 (bookworm) amd64 only"
	fi
}

confirm() {
	if [ "$yes" = yes ]; then
		return
	fi
	local answer=""
	read -r -p "Install EFA installer stand-in $EFA_VERSION? [y/N] " answer || true
	case "$answer" in
	y|Y|yes|YES) ;;
	*) die "installation not confirmed (pass -y to install without prompting)" ;;
	esac
}

# apt installs from DEB_DIR as the only repository, with its own source list and list
# directory: no network is needed, the system's apt configuration and lists stay untouched,
# exactly the bundled versions are installed, and only what this system lacks (a newer
# installed package is kept, never downgraded).
install_packages() {
	local packages="$RDMA_PACKAGES" apt_dir
	if [ "$minimal" = no ]; then packages="$packages $FABRIC_PACKAGES"; fi
	echo "== Installing $packages =="
	apt_dir=$(mktemp -d)
	chmod 755 "$apt_dir"  # apt reads the index as its unprivileged _apt user
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
	echo "deb [trusted=yes] file:$DEB_DIR ./" > "$apt_dir/sources.list"
	local -a options=(-o Dir::Etc::SourceList="$apt_dir/sources.list"
		-o Dir::Etc::SourceParts="$apt_dir/sources.list.d" -o Dir::State::Lists="$apt_dir/lists")
	apt-get update -qq "${options[@]}"
	# shellcheck disable=SC2086 # a list of package names
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${options[@]}" $packages
	rm -rf "$apt_dir"
}

# Real files, as aws-ofi-nccl's --with-libfabric=/opt/amazon/efa and the efa stage's exports need:
# every file the three libfabric packages put under /usr/include, the multiarch lib dir and
# /usr/bin, copied to the same place under /opt/amazon/efa (links stay links).
install_libfabric_tree() {
	local package path dest
	for package in libfabric1 libfabric-dev libfabric-bin; do
		dpkg-query -L "$package" | while read -r path; do
			case "$path" in
			/usr/include/*) dest="$EFA_PREFIX/include/${path#/usr/include/}" ;;
			"$MULTIARCH"/*) dest="$EFA_PREFIX/lib/${path#"$MULTIARCH"/}" ;;
			/usr/bin/*) dest="$EFA_PREFIX/bin/${path#/usr/bin/}" ;;
			*) continue ;;
			esac
			if [ -d "$path" ] && [ ! -L "$path" ]; then
				mkdir -p "$dest"
			else
				mkdir -p "$(dirname "$dest")"
				cp -a "$path" "$dest"
			fi
		done
	done
	# pkg-config then points builds at /opt/amazon/efa, as the real installer's libfabric.pc does.
	sed -i -e "s|^prefix=.*|prefix=$EFA_PREFIX|" -e "s|^libdir=.*|libdir=\${prefix}/lib|" \
		-e "s|^includedir=.*|includedir=\${prefix}/include|" "$EFA_PREFIX/lib/pkgconfig/libfabric.pc"
}

# Debian's Open MPI is not relocatable (its wrappers and plugins use compiled-in paths), so
# /opt/amazon/openmpi holds links: bin/ to Debian's commands, include/ and lib/ entries to
# Debian's Open MPI directory, plus lib/libmpi.so.40* that live one level up there.
install_openmpi_tree() {
	local name target
	mkdir -p "$MPI_PREFIX/bin" "$MPI_PREFIX/include" "$MPI_PREFIX/lib"
	for name in mpirun mpiexec orterun mpicc mpic++ mpicxx mpiCC mpif77 mpif90 mpifort ompi_info \
		ortecc oshrun oshmem_info; do
		target=$(readlink -f "/usr/bin/$name" 2>/dev/null) || continue
		[ -e "$target" ] && ln -sfn "$target" "$MPI_PREFIX/bin/$name"
	done
	for target in "$MULTIARCH"/openmpi/include/* "$MULTIARCH"/openmpi/lib/* "$MULTIARCH"/libmpi.so.40* \
		"$MULTIARCH"/libmpi_cxx.so.40* "$MULTIARCH"/libopen-rte.so.40* "$MULTIARCH"/libopen-pal.so.40*; do
		case "$target" in
		*/include/*) ln -sfn "$target" "$MPI_PREFIX/include/${target##*/}" ;;
		*) ln -sfn "$target" "$MPI_PREFIX/lib/${target##*/}" ;;
		esac
	done
}

write_system_config() {
	mkdir -p /etc/ld.so.conf.d
	echo "$EFA_PREFIX/lib" > /etc/ld.so.conf.d/efa.conf
	if [ "$skip_limit_conf" = no ]; then
		mkdir -p /etc/security/limits.d
		printf '* soft memlock unlimited\n* hard memlock unlimited\n' > /etc/security/limits.d/efa.conf
	fi
	ldconfig
}

write_package_list() {
	local packages="$RDMA_PACKAGES"
	if [ "$minimal" = no ]; then packages="$packages $FABRIC_PACKAGES libopenmpi3"; fi
	mkdir -p /opt/amazon
	{
		echo "# EFA installer version: $EFA_VERSION (stand-in from Debian 12 packages)"
		echo "# Debug packages installed: no"
		echo "# GPUDirect RDMA enabled: $enable_gdr"
		echo "# Packages installed:"
		# shellcheck disable=SC2086 # a list of package names
		dpkg-query -W -f '${Package} ${Version}\n' $packages
	} > /opt/amazon/efa_installed_packages
}

verify() {
	if [ "$no_verify" = yes ] || [ "$minimal" = yes ]; then
		return
	fi
	echo "== Testing libfabric =="
	echo "No EFA device in this environment; checking that libfabric loads and its providers resolve."
	"$EFA_PREFIX/bin/fi_info" --version
	if ldd "$EFA_PREFIX/lib/libfabric.so.1" | grep 'not found'; then
		die "$EFA_PREFIX/lib/libfabric.so.1 has unresolved libraries"
	fi
	"$EFA_PREFIX/bin/fi_info" -l
}

main() {
	parse_args "$@"
	check_system
	confirm
	echo "== EFA installer stand-in $EFA_VERSION =="
	if [ "$skip_kmod" = no ]; then
		echo "This stand-in installs no EFA kernel module; continuing with user space components."
	fi
	if [ "$debug_packages" = yes ]; then
		echo "No debug packages are bundled in this stand-in; continuing without them."
	fi
	install_packages
	if [ "$minimal" = no ]; then
		install_libfabric_tree
		install_openmpi_tree
	fi
	write_system_config
	write_package_list
	verify
	echo "==================================================="
	echo "EFA installation complete (stand-in)."
	if [ "$minimal" = no ]; then
		echo "- Libfabric was installed in $EFA_PREFIX"
		echo "- Open MPI was installed in $MPI_PREFIX"
	else
		echo "- Only rdma-core was installed (--minimal)"
	fi
	echo "==================================================="
}

main "$@"
