#!/bin/bash
# b2 (sample): builds Boost's compiled libraries with g++ and installs them with the headers.
# Understands the usual command line: targets (stage, install, headers), --prefix/--libdir/
# --includedir, --with-<lib>/--without-<lib>, -jN, and the features variant, link, threading,
# runtime-link, toolset, cxxflags, cflags, linkflags, define, include. Compilation runs under
# make, so -jN is honoured and any failure makes b2 exit non-zero.
set -euo pipefail

readonly VERSION="@@BOOST_VERSION@@"
readonly ROOT="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
readonly ALL_LIBS="chrono filesystem system thread"

jam_option() {
	# Reads "option.set NAME : VALUE ;" from project-config.jam.
	[ -f "$ROOT/project-config.jam" ] || return 0
	sed -n "s/^option\.set $1 : \(.*\) ;$/\1/p" "$ROOT/project-config.jam" | tail -n 1
}

jam_libraries() {
	[ -f "$ROOT/project-config.jam" ] || return 0
	sed -n 's/^libraries = \(.*\) ;$/\1/p' "$ROOT/project-config.jam" | sed 's/--with-//g'
}

prefix=$(jam_option prefix)
prefix=${prefix:-/usr/local}
libdir=$(jam_option libdir)
includedir=$(jam_option includedir)
builddir="$ROOT/bin.v2"
stagedir="$ROOT/stage"
prefix_given=no
libdir_given=no
includedir_given=no
jobs=1
variant=release
link="shared,static"
threading=multi
cxxflags=""
cflags=""
linkflags=""
defines=""
includes=""
libs_with=""
libs_without=""
targets=""

die() {
	echo "error: $*" >&2
	exit 1
}

while [ $# -gt 0 ]; do
	arg="$1"
	shift
	case "$arg" in
	-j)
		[ $# -gt 0 ] || die "-j needs a number, as in -j2"
		jobs="$1"
		shift
		;;
	-j*) jobs=${arg#-j} ;;
	--prefix=*) prefix=${arg#*=}; prefix_given=yes ;;
	--exec-prefix=*) : ;;
	--libdir=*) libdir=${arg#*=}; libdir_given=yes ;;
	--includedir=*) includedir=${arg#*=}; includedir_given=yes ;;
	--build-dir=*) builddir=${arg#*=} ;;
	--stagedir=*) stagedir=${arg#*=} ;;
	--with-*) libs_with="$libs_with ${arg#--with-}" ;;
	--without-*) libs_without="$libs_without ${arg#--without-}" ;;
	--layout=*|--build-type=*|--reconfigure|-q|-a|-d*|--debug-configuration|--ignore-site-config) : ;;
	--help|-h) sed -n '2,7p' "$0"; exit 0 ;;
	variant=*) variant=${arg#*=} ;;
	link=*) link=${arg#*=} ;;
	threading=*) threading=${arg#*=} ;;
	runtime-link=*|toolset=*|address-model=*|architecture=*|optimization=*|debug-symbols=*) : ;;
	cxxflags=*) cxxflags="$cxxflags ${arg#*=}" ;;
	cflags=*) cflags="$cflags ${arg#*=}" ;;
	linkflags=*) linkflags="$linkflags ${arg#*=}" ;;
	define=*) defines="$defines -D${arg#*=}" ;;
	include=*) includes="$includes -I${arg#*=}" ;;
	*=*) die "unknown feature '${arg%%=*}' in '$arg'" ;;
	stage|install|headers) targets="$targets $arg" ;;
	-*) die "unknown option '$arg'" ;;
	*) die "don't know how to make $arg" ;;
	esac
done

[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "invalid job count '$jobs'"

# An explicit --prefix moves the default libdir and includedir with it, whatever
# bootstrap.sh recorded; explicit --libdir/--includedir still win.
if [ "$prefix_given" = yes ]; then
	[ "$libdir_given" = yes ] || libdir=""
	[ "$includedir_given" = yes ] || includedir=""
fi
libdir=${libdir:-$prefix/lib}
includedir=${includedir:-$prefix/include}
targets=${targets:- stage}

selected_libs() {
	local wanted="${libs_with:-$(jam_libraries)}"
	wanted="${wanted:-$ALL_LIBS}"
	for lib in $wanted; do
		case " $ALL_LIBS " in *" $lib "*) ;; *) die "wrong library name '$lib' in the --with-<library> option." ;; esac
		case " $libs_without " in *" $lib "*) continue ;; esac
		echo "$lib"
	done
}

case "$variant" in
release) optflags="-O3 -DNDEBUG" ;;
debug) optflags="-O0 -g" ;;
profile) optflags="-O3 -g -pg -DNDEBUG" ;;
*) die "invalid value '$variant' for feature 'variant'" ;;
esac
case "$threading" in
multi) threadflags="-pthread" ;;
single) threadflags="" ;;
*) die "invalid value '$threading' for feature 'threading'" ;;
esac

# The generated makefile: one object per source, then a shared and/or static library per lib.
write_makefile() {
	local mk="$1" lib src obj objs outdir
	outdir="$builddir/libs"
	{
		echo "CXX := ${CXX:-g++}"
		echo "CXXFLAGS := -std=c++11 -fPIC -fvisibility=hidden -Wall $optflags $threadflags $defines $includes -I$ROOT $cxxflags"
		echo "LINKFLAGS := $threadflags $linkflags"
		echo "all:"
		for lib in $(selected_libs); do
			objs=""
			while IFS= read -r src; do
				obj="$outdir/$lib/build/gcc/$variant/threading-$threading/${src#libs/$lib/src/}"
				obj="${obj%.cpp}.o"
				objs="$objs $obj"
				printf '%s: %s\n\t@mkdir -p $(@D)\n\t@echo "gcc.compile.c++ %s"\n\t$(CXX) $(CXXFLAGS) -DBOOST_%s_SOURCE -c $< -o $@\n' \
					"$obj" "$ROOT/$src" "${obj#$ROOT/}" "${lib^^}"
			done < <(cd "$ROOT" && find "libs/$lib/src" -name '*.cpp' | LC_ALL=C sort)
			case ",$link," in *,shared,*)
				echo "all: $stagedir/lib/libboost_$lib.so.$VERSION"
				printf '%s: %s\n\t@mkdir -p $(@D)\n\t@echo "gcc.link.dll %s"\n\t$(CXX) -shared -Wl,-soname,libboost_%s.so.%s -o $@ $^ $(LINKFLAGS)\n\tln -sf libboost_%s.so.%s %s\n' \
					"$stagedir/lib/libboost_$lib.so.$VERSION" "$objs" "libboost_$lib.so.$VERSION" \
					"$lib" "$VERSION" "$lib" "$VERSION" "$stagedir/lib/libboost_$lib.so"
				;;
			esac
			case ",$link," in *,static,*)
				echo "all: $stagedir/lib/libboost_$lib.a"
				printf '%s: %s\n\t@mkdir -p $(@D)\n\t@echo "gcc.archive %s"\n\trm -f $@ && ar rcs $@ $^\n' \
					"$stagedir/lib/libboost_$lib.a" "$objs" "libboost_$lib.a"
				;;
			esac
		done
	} > "$mk"
}

build_libraries() {
	local mk="$builddir/sample-b2.mk"
	mkdir -p "$builddir"
	write_makefile "$mk"
	echo "Performing configuration checks"
	echo "    - default address-model    : 64-bit"
	echo "    - default architecture     : x86"
	echo "Building the Boost C++ Libraries."
	if ! make -s -j"$jobs" -f "$mk" all; then
		echo "...failed updating targets..." >&2
		exit 1
	fi
}

install_all() {
	echo "common.copy $includedir/boost"
	mkdir -p "$includedir" "$libdir"
	cp -R "$ROOT/boost" "$includedir/"
	for lib in $(selected_libs); do
		for file in "$stagedir/lib/libboost_$lib".*; do
			[ -e "$file" ] || continue
			echo "common.copy $libdir/$(basename "$file")"
			cp -P "$file" "$libdir/"
		done
	done
}

for target in $targets; do
	case "$target" in
	headers) echo "...found 1 target..." ;;
	stage) build_libraries ;;
	install) build_libraries; install_all ;;
	esac
done
echo "...updated targets..."
if [[ " $targets " == *" stage "* ]]; then
	echo ""
	echo "The Boost C++ Libraries were successfully built!"
	echo ""
	echo "The following directory should be added to compiler include paths:"
	echo ""
	echo "    $ROOT"
	echo ""
	echo "The following directory should be added to linker library paths:"
	echo ""
	echo "    $stagedir/lib"
fi
