"""Writes the sample upstream: tarballs and wheels, bare git repositories and pins.json.

Layout of the output directory:

    files/<artifact>        EFA installer and boost tarballs, SMDDP wheels
    git/<name>.git          nccl, pytorch, vision, aws-ofi-nccl, nccl-tests
    pins.json               sha256 of every file, tag -> commit of every repository

Everything is derived from the text sources in ``sample/sources`` and the release tables below,
with fixed dates and authors, so that the same checkout writes the same bytes and commit SHAs
on every machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sample.archive import WheelSpec, make_tar_gz, make_wheel
from sample.gitrepo import Commit, tag_commits, write_bare_repo
from sample.native import compile_shared_library
from sample.templates import SourceFile, render_component, render_one

PINS_FORMAT = 1


def _ts(day: str) -> int:
    """Seconds since the epoch of a UTC date (YYYY-MM-DD)."""
    return int(datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp())


@dataclass(frozen=True)
class Artifact:
    """A file served under /files/."""

    name: str
    data: bytes
    meta: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Patch:
    """A literal edit applied to one rendered file of one commit (a code change in history)."""

    path: str
    old: str
    new: str


# --------------------------------------------------------------------------- EFA installer


@dataclass(frozen=True)
class EfaRelease:
    version: str
    libfabric: str  # bundled libfabric
    openmpi: str
    openmpi_date: str
    # From 1.38 the installer ships aws-ofi-nccl itself: the plugin's version, and the directory
    # under /opt/amazon/ofi-nccl it lands in, which for the real installer varies with its
    # version and the OS (lib/x86_64-linux-gnu, lib, lib64). Empty: no plugin.
    plugin: str = ""
    plugin_dir: str = ""


EFA_RELEASES = (
    EfaRelease("1.11.2", "1.11.1", "4.1.0", "Dec 18, 2020"),
    EfaRelease("1.14.1", "1.13.2", "4.1.1", "Apr 24, 2021"),
    EfaRelease("1.15.1", "1.14.0", "4.1.1", "Apr 24, 2021"),
)

# Installers that bundle the plugin, in two of the real layouts. Not in files/: a policy such
# as "~=1.14" would take them as upgrades of every sample lock. `python -m sample efa-installer`
# writes one for a test to serve. Their plugin releases are below 1.10, which the rules pair
# with the sample's NCCL 2.10/2.11 (aws-ofi-nccl 1.10 and later need NCCL 2.17.1).
BUNDLING_EFA_RELEASES = (
    EfaRelease("1.38.0", "1.22.0", "4.1.6", "Sep 30, 2023", plugin="1.9.1",
               plugin_dir="lib/x86_64-linux-gnu"),
    EfaRelease("1.43.0", "2.1.0", "4.1.7", "Oct 30, 2024", plugin="1.9.2", plugin_dir="lib64"),
)
# The NCCL whose nccl.h and nccl_net.h the bundled plugin is compiled with (the real plugin
# carries its own copy of NCCL's net headers, and links no libnccl).
_PLUGIN_HEADERS_NCCL = (2, 10, 3)


def efa_variables(release: EfaRelease) -> dict[str, str]:
    fab_major, fab_minor, fab_rev = release.libfabric.split(".")
    mpi_major, mpi_minor, mpi_release = release.openmpi.split(".")
    return {
        "EFA_VERSION": release.version,
        "LIBFABRIC_VERSION": release.libfabric,
        # The EFA build of libfabric reports itself with an amzn suffix, as the real one does.
        "LIBFABRIC_PACKAGE_VERSION": f"{release.libfabric}amzn1.0",
        "LIBFABRIC_MAJOR": fab_major,
        "LIBFABRIC_MINOR": fab_minor,
        "LIBFABRIC_REVISION": fab_rev,
        "OMPI_VERSION": release.openmpi,
        "OMPI_MAJOR": mpi_major,
        "OMPI_MINOR": mpi_minor,
        "OMPI_RELEASE": mpi_release,
        "OMPI_RELEASE_DATE": release.openmpi_date,
        "OFI_NCCL_VERSION": release.plugin,
        "OFI_NCCL_DIR": release.plugin_dir,
    }


def efa_artifacts() -> list[Artifact]:
    return [efa_artifact(release) for release in EFA_RELEASES]


def efa_artifact(release: EfaRelease) -> Artifact:
    files = render_component("efa", efa_variables(release))
    # The sources are kept under aws-efa-installer/ so that the tarball's top dir is theirs.
    inner = [_strip_prefix(f, "aws-efa-installer/") for f in files]
    meta = {"version": release.version, "libfabric": release.libfabric,
            "openmpi": release.openmpi}
    if release.plugin:
        inner = apply_patches(inner, _INSTALLS_PLUGIN)
        inner += bundled_plugin_sources(release)
        meta["aws-ofi-nccl"] = release.plugin
    data = make_tar_gz(inner, "aws-efa-installer")
    return Artifact(f"aws-efa-installer-{release.version}.tar.gz", data, meta)


# The installer of a release that ships the plugin runs src/ofi-nccl/install.sh after Open MPI.
_INSTALLS_PLUGIN = (
    Patch("efa_installer.sh", '\t\tbuild_openmpi "$BUILD_DIR"\n',
          '\t\tbuild_openmpi "$BUILD_DIR"\n'
          '\t\t"$SRC_DIR/ofi-nccl/install.sh" "$BUILD_DIR" "$EFA_PREFIX" '
          '"$ROOT/opt/amazon/ofi-nccl" "$(cflags)"\n'),
    Patch("efa_installer.sh", '\trm -rf "$EFA_PREFIX" "$MPI_PREFIX" ',
          '\trm -rf "$EFA_PREFIX" "$MPI_PREFIX" "$ROOT/opt/amazon/ofi-nccl" '),
    Patch("efa_installer.sh", '\techo "- Open MPI was installed in /opt/amazon/openmpi"\n',
          '\techo "- Open MPI was installed in /opt/amazon/openmpi"\n'
          '\techo "- aws-ofi-nccl was installed in /opt/amazon/ofi-nccl"\n'),
)


def bundled_plugin_sources(release: EfaRelease) -> list[SourceFile]:
    """src/ofi-nccl/ of an installer that ships the plugin: its install script, the sample
    aws-ofi-nccl's own sources at the bundled version, NCCL's two headers they compile with,
    and the config.h its configure would write (--enable-platform-aws, as AWS builds it)."""
    version = release.plugin
    plugin = {f.path: f for f in render_component("aws-ofi-nccl", {"OFI_VERSION": version})}
    nccl = nccl_variables(_PLUGIN_HEADERS_NCCL)
    major, minor, patch = _PLUGIN_HEADERS_NCCL
    header = render_one("nccl", "src/nccl.h.in", nccl).decode()
    # What NCCL's src/Makefile substitutes when it installs nccl.h.
    for name, value in (("Major", major), ("Minor", minor), ("Patch", patch), ("Suffix", ""),
                        ("Version", major * 10000 + minor * 100 + patch)):
        header = header.replace(f"${{nccl:{name}}}", str(value))
    config = (f'#define PACKAGE_VERSION "{version}"\n'
              f'#define PACKAGE_STRING "aws-ofi-nccl {version}"\n'
              "#define ENABLE_PLATFORM_AWS 1\n")
    script = render_component("efa-ofi-nccl", efa_variables(release))
    return [SourceFile("src/ofi-nccl/" + f.path, f.data, f.mode) for f in script] + [
        SourceFile("src/ofi-nccl/" + path.rsplit("/", 1)[-1], plugin[path].data, 0o644)
        for path in ("src/nccl_ofi_net.c", "src/nccl_ofi_loopback.c", "include/nccl_ofi.h")
    ] + [
        SourceFile("src/ofi-nccl/nccl.h", header.encode(), 0o644),
        SourceFile("src/ofi-nccl/nccl_net.h", render_one("nccl", "src/include/nccl_net.h", nccl),
                   0o644),
        SourceFile("src/ofi-nccl/config.h", config.encode(), 0o644),
    ]


def _strip_prefix(source: SourceFile, prefix: str) -> SourceFile:
    if not source.path.startswith(prefix):
        raise ValueError(f"{source.path} is not under {prefix}")
    return SourceFile(source.path[len(prefix) :], source.data, source.mode)


# --------------------------------------------------------------------------- boost

BOOST_VERSIONS = ("1.73.0", "1.74.0")


def boost_variables(version: str) -> dict[str, str]:
    major, minor, patch = (int(p) for p in version.split("."))
    return {
        "BOOST_VERSION": version,
        "BOOST_VERSION_NUMBER": str(major * 100000 + minor * 100 + patch),
        "BOOST_LIB_VERSION": f"{major}_{minor}" if patch == 0 else f"{major}_{minor}_{patch}",
        "BOOST_DIR": f"boost_{major}_{minor}_{patch}",
    }


def boost_artifacts() -> list[Artifact]:
    out = []
    for version in BOOST_VERSIONS:
        variables = boost_variables(version)
        top = variables["BOOST_DIR"]
        data = make_tar_gz(render_component("boost", variables), top)
        out.append(Artifact(f"{top}.tar.gz", data, {"version": version}))
    return out


# --------------------------------------------------------------------------- SMDDP wheels


@dataclass(frozen=True)
class SmddpRelease:
    version: str
    torch: str  # the PyTorch release the wheel is built for


SMDDP_RELEASES = (SmddpRelease("1.4.0", "1.10.2"), SmddpRelease("1.4.1", "1.10.2"))
SMDDP_TAG = "cp311-cp311-linux_x86_64"
_SMDDP_WHEEL_DIR = "wheel/"
_SMDDP_LIB = "smdistributed/dataparallel/lib/libsmddp.so"


def smddp_artifacts() -> list[Artifact]:
    out = []
    for release in SMDDP_RELEASES:
        variables = {"SMDDP_VERSION": release.version, "SMDDP_TORCH_VERSION": release.torch}
        files = [
            _strip_prefix(f, _SMDDP_WHEEL_DIR)
            for f in render_component("smddp", variables)
            if f.path.startswith(_SMDDP_WHEEL_DIR)
        ]
        library = compile_shared_library(
            render_one("smddp", "native/smddp.c", variables),
            "libsmddp.so",
            (render_one("smddp", "native/fabric_stub.c", variables), "libfabric.so.1"),
        )
        files.append(SourceFile(_SMDDP_LIB, library, 0o755))
        spec = WheelSpec(
            distribution="smdistributed_dataparallel",
            project_name="smdistributed-dataparallel",
            version=release.version,
            tag=SMDDP_TAG,
            summary=f"SageMaker distributed data parallel (sample, for torch {release.torch})",
            requires_python="==3.11.*",
            top_level=("smdistributed",),
        )
        meta = {"version": release.version, "torch": release.torch}
        out.append(Artifact(spec.filename, make_wheel(spec, files), meta))
    return out


# --------------------------------------------------------------------------- git repositories

NCCL_FIX_LABEL = "post-v2.10.3-1-fix"

# Before the fix, a failed group left its queued operations behind to run at the next group.
_NCCL_PRE_FIX = Patch(
    "src/group.cc",
    "  if (ret == ncclSuccess) ret = runQueued(false);\n  ncclGroupOps.clear();\n",
    "  if (ret == ncclSuccess) ret = runQueued(false);\n  if (ret != ncclSuccess) return ret;\n"
    "  ncclGroupOps.clear();\n",
)
# A development change that was tagged but never released.
_NCCL_INC_NSTEPS = Patch(
    "src/include/reduce.h",
    "if (bytes < 8192) return NCCL_PROTO_LL;",
    "if (bytes < 16384) return NCCL_PROTO_LL;",
)

_OLD_VERSION_MACRO = "#define NCCL_VERSION(X,Y,Z) ((X) * 1000 + (Y) * 100 + (Z))"
_NEW_VERSION_MACRO = (
    "#define NCCL_VERSION(X,Y,Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : "
    "(X) * 10000 + (Y) * 100 + (Z))"
)


@dataclass(frozen=True)
class NcclCommit:
    label: str
    version: tuple[int, int, int]
    day: str
    message: str
    annotated: Sequence[str] = ()
    lightweight: Sequence[str] = ()
    patches: Sequence[Patch] = ()


NCCL_HISTORY = (
    NcclCommit(
        "v2.7.8-1", (2, 7, 8), "2020-07-28", "2.7.8-1", ("v2.7.8-1",), patches=(_NCCL_PRE_FIX,)
    ),
    NcclCommit(
        "inc_nsteps",
        (2, 7, 8),
        "2020-09-02",
        "Use the LL protocol up to 16 KiB",
        lightweight=("inc_nsteps",),
        patches=(_NCCL_PRE_FIX, _NCCL_INC_NSTEPS),
    ),
    NcclCommit(
        "v2.10.3-1", (2, 10, 3), "2021-07-08", "2.10.3-1", ("v2.10.3-1",), patches=(_NCCL_PRE_FIX,)
    ),
    NcclCommit(
        NCCL_FIX_LABEL,
        (2, 10, 3),
        "2021-08-12",
        "Fix queued group operations surviving a failed ncclGroupEnd",
    ),
    NcclCommit("v2.11.4-1", (2, 11, 4), "2021-09-08", "2.11.4-1", ("v2.11.4-1",)),
)


def nccl_variables(version: tuple[int, int, int]) -> dict[str, str]:
    major, minor, patch = version
    # NCCL changed its version code from X*1000+Y*100+Z to X*10000+Y*100+Z in 2.9.
    new_scheme = (major, minor) >= (2, 9)
    return {
        "NCCL_MAJOR": str(major),
        "NCCL_MINOR": str(minor),
        "NCCL_PATCH": str(patch),
        "NCCL_SUFFIX": "",
        # version.mk has no space after ":=" when the suffix is empty.
        "NCCL_SUFFIX_MK": "",
        "PKG_REVISION": "1",
        "NCCL_VERSION_PRINTF": "%d%02d%02d" if new_scheme else "%d%d%02d",
        "NCCL_VERSION_MACRO": _NEW_VERSION_MACRO if new_scheme else _OLD_VERSION_MACRO,
    }


def apply_patches(files: Sequence[SourceFile], patches: Iterable[Patch]) -> list[SourceFile]:
    """Apply literal edits; each must match exactly once, so a template change cannot silently
    turn a patch into a no-op."""
    by_path = {f.path: f for f in files}
    for patch in patches:
        source = by_path[patch.path]
        text = source.data.decode()
        if text.count(patch.old) != 1:
            raise ValueError(f"patch for {patch.path} does not match exactly once: {patch.old!r}")
        by_path[patch.path] = SourceFile(
            patch.path, text.replace(patch.old, patch.new).encode(), source.mode
        )
    return [by_path[f.path] for f in files]


def nccl_commits() -> list[Commit]:
    commits = []
    for entry in NCCL_HISTORY:
        files = apply_patches(
            render_component("nccl", nccl_variables(entry.version)), entry.patches
        )
        commits.append(
            Commit(
                entry.label,
                entry.message,
                _ts(entry.day),
                files,
                annotated_tags=entry.annotated,
                lightweight_tags=entry.lightweight,
            )
        )
    return commits


@dataclass(frozen=True)
class TorchRelease:
    tag: str
    version: str
    day: str
    nccl_commit: str  # label in NCCL_HISTORY the submodule is pinned to


TORCH_RELEASES = (
    TorchRelease("v1.10.2", "1.10.2", "2022-01-27", "v2.10.3-1"),
    TorchRelease("v1.11.0", "1.11.0", "2022-03-10", NCCL_FIX_LABEL),
)
NCCL_SUBMODULE = "third_party/nccl/nccl"


def pytorch_commits(nccl_shas: Mapping[str, str]) -> list[Commit]:
    return [
        Commit(
            release.tag,
            f"Release {release.version}",
            _ts(release.day),
            render_component("pytorch", {"TORCH_VERSION": release.version}),
            gitlinks={NCCL_SUBMODULE: nccl_shas[release.nccl_commit]},
            annotated_tags=(release.tag,),
        )
        for release in TORCH_RELEASES
    ]


def simple_commits(
    component: str, variable: str, releases: Sequence[tuple[str, str]], annotated: bool
) -> list[Commit]:
    """One commit per (tag, day); the tag's version (without "v") goes into ``variable``."""
    commits = []
    for tag, day in releases:
        version = tag.removeprefix("v")
        files = render_component(component, {variable: version})
        commits.append(
            Commit(
                tag,
                f"Release {version}",
                _ts(day),
                files,
                annotated_tags=(tag,) if annotated else (),
                lightweight_tags=() if annotated else (tag,),
            )
        )
    return commits


VISION_RELEASES = (("v0.9.1", "2021-03-25"), ("v0.11.3", "2022-01-27"), ("v0.12.0", "2022-03-10"))
OFI_RELEASES = (
    ("v1.1.1", "2020-09-25"),
    ("v1.1.3-aws", "2021-06-30"),
    ("v1.2.0-aws", "2021-11-10"),
)
NCCL_TESTS_RELEASES = (("v2.0.0", "2019-01-11"), ("v2.11.0", "2021-09-14"))


# --------------------------------------------------------------------------- output


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def all_artifacts() -> list[Artifact]:
    return [*efa_artifacts(), *boost_artifacts(), *smddp_artifacts()]


def _write_files(root: Path, artifacts: Sequence[Artifact]) -> dict[str, object]:
    files_dir = root / "files"
    files_dir.mkdir()
    pins: dict[str, object] = {}
    for artifact in sorted(artifacts, key=lambda a: a.name):
        (files_dir / artifact.name).write_bytes(artifact.data)
        pins[artifact.name] = {
            "url": f"/files/{artifact.name}",
            "sha256": sha256(artifact.data),
            "size": len(artifact.data),
            "meta": dict(sorted(artifact.meta.items())),
        }
    return pins


def _repo_pins(path: Path, name: str, labels: Mapping[str, str]) -> dict[str, object]:
    return {
        "url": f"/git/{name}.git",
        "tags": tag_commits(path),
        "commits": dict(labels),
        "head": list(labels.values())[-1],
    }


def _write_repos(root: Path) -> dict[str, object]:
    git_dir = root / "git"
    git_dir.mkdir()
    repos: dict[str, object] = {}

    def build(name: str, commits: Sequence[Commit], **extra: object) -> dict[str, str]:
        labels = write_bare_repo(git_dir / f"{name}.git", commits)
        repos[name] = {**_repo_pins(git_dir / f"{name}.git", name, labels), **extra}
        return labels

    nccl = build("nccl", nccl_commits())
    submodules = {
        release.tag: {NCCL_SUBMODULE: nccl[release.nccl_commit]} for release in TORCH_RELEASES
    }
    build("pytorch", pytorch_commits(nccl), submodules=submodules)
    build("vision", simple_commits("vision", "VISION_VERSION", VISION_RELEASES, annotated=False))
    build(
        "aws-ofi-nccl", simple_commits("aws-ofi-nccl", "OFI_VERSION", OFI_RELEASES, annotated=True)
    )
    build(
        "nccl-tests",
        simple_commits("nccl-tests", "NCCL_TESTS_VERSION", NCCL_TESTS_RELEASES, annotated=False),
    )
    return dict(sorted(repos.items()))


def write_upstream(root: Path) -> dict[str, object]:
    """Write files/, git/ and pins.json into the empty directory ``root``; returns the pins."""
    pins = {
        "format": PINS_FORMAT,
        "files": _write_files(root, all_artifacts()),
        "repos": _write_repos(root),
    }
    (root / "pins.json").write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    return pins


def generate(out: Path) -> dict[str, object]:
    """(Re)generate the upstream into ``out``.

    Everything is first written to a staging directory inside ``out`` and then swapped in, so
    an interrupted run never leaves half a repository behind, and a server already serving
    ``out`` sees either the old or the new tree.
    """
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        pins = write_upstream(staging)
        for name in ("files", "git", "pins.json"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            os.replace(staging / name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return pins
