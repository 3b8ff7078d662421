"""Command line: `python -m realparts efa-installer|lock-efa-debs ...`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from realparts.debs import DEFAULT_MIRROR, DebError, resolve, write_lock
from realparts.efa_installer import LOCK, PACKAGES, generate


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "imageforge" / "debs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realparts")
    commands = parser.add_subparsers(dest="command", required=True)
    efa = commands.add_parser("efa-installer", help="write aws-efa-installer-<version>.tar.gz")
    efa.add_argument("--version", required=True, help="the installer version it is named after")
    efa.add_argument("--out", type=Path, required=True, help="directory for the tarball")
    efa.add_argument("--mirror", default=DEFAULT_MIRROR, help="Debian mirror (%(default)s)")
    efa.add_argument("--deb-cache", type=Path, default=default_cache(),
                     help="where downloaded .debs are kept (%(default)s)")
    lock = commands.add_parser("lock-efa-debs",
                               help=f"re-resolve the bundled .debs into {LOCK.name} (Docker)")
    lock.add_argument("--image", default="imageforge/base:bookworm",
                      help="a Debian 12 image with python3 that reaches Debian's mirror")
    args = parser.parse_args(argv)
    try:
        if args.command == "efa-installer":
            made = generate(args.version, args.out, args.mirror, args.deb_cache)
            print(f"{made.path} {made.size} bytes sha256 {made.sha256}")
        else:
            debs = resolve(PACKAGES, args.image)
            write_lock(LOCK, PACKAGES, debs, args.image)
            print(f"{LOCK}: {len(debs)} packages, {sum(d.size for d in debs)} bytes")
    except DebError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
