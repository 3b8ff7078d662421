"""Command line.

python -m sample generate --out DIR
python -m sample serve --dir DIR [--host 127.0.0.1] [--port 8741] [--verbose]
python -m sample build --dir DIR --work WORK     (host builds, prints seconds per step)
python -m sample efa-installer --version V --out DIR   (an installer that ships aws-ofi-nccl)
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from sample.generate import BUNDLING_EFA_RELEASES, efa_artifact, generate
from sample.gitrepo import GitError
from sample.hostbuild import BuildFailed, HostBuild, build_all
from sample.native import NativeBuildError
from sample.serve import make_server
from sample.templates import TemplateError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sample", description="Sample upstream for imageforge tests."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="write files/, git/ and pins.json into a directory")
    gen.add_argument("--out", type=Path, required=True, help="output directory")
    srv = commands.add_parser("serve", help="serve a generated directory over HTTP")
    srv.add_argument("--dir", type=Path, required=True, help="directory written by generate")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8741)
    srv.add_argument("--verbose", action="store_true", help="log every request")
    bld = commands.add_parser("build", help="build every component on this host and time it")
    bld.add_argument("--dir", type=Path, required=True, help="directory written by generate")
    bld.add_argument("--work", type=Path, required=True, help="scratch directory for the builds")
    bld.add_argument("--no-autotools", action="store_true", help="skip aws-ofi-nccl")
    efa = commands.add_parser("efa-installer",
                              help="write an EFA installer that ships aws-ofi-nccl (not in files/)")
    efa.add_argument("--version", required=True,
                     choices=[r.version for r in BUNDLING_EFA_RELEASES])
    efa.add_argument("--out", type=Path, required=True, help="directory to write it into")
    return parser


def _generate(out: Path) -> int:
    try:
        pins = generate(out)
    except (GitError, NativeBuildError, TemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files, repos = pins["files"], pins["repos"]
    assert isinstance(files, dict)
    assert isinstance(repos, dict)
    print(f"wrote {len(files)} files and {len(repos)} repositories to {out} (see {out}/pins.json)")
    return 0


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _serve(directory: Path, host: str, port: int, verbose: bool) -> int:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    try:
        server = make_server(directory, host, port, verbose)
    except (FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _stop)
    bound_host, bound_port = server.server_address[0], server.server_address[1]
    print(f"serving {directory} at http://{bound_host!s}:{bound_port}/ (files/, git/)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _build(directory: Path, work: Path, with_autotools: bool) -> int:
    try:
        timings = build_all(HostBuild(directory.resolve(), work.resolve()), with_autotools)
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({step: round(seconds, 2) for step, seconds in timings.items()}, indent=2))
    return 0


def _efa_installer(version: str, out: Path) -> int:
    release = next(r for r in BUNDLING_EFA_RELEASES if r.version == version)
    artifact = efa_artifact(release)
    out.mkdir(parents=True, exist_ok=True)
    (out / artifact.name).write_bytes(artifact.data)
    print(out / artifact.name)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "generate":
        return _generate(args.out)
    if args.command == "efa-installer":
        return _efa_installer(args.version, args.out)
    if args.command == "build":
        return _build(args.dir, args.work, not args.no_autotools)
    return _serve(args.dir, args.host, args.port, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
