"""`imageforge`: the invoke tasks of this checkout, runnable from any directory.

`.venv/bin/invoke` finds tasks.py by looking in the current directory and above, so it works
only inside the checkout; this entry point loads the checkout's tasks.py itself (and the
invoke.yaml beside it). Relative paths (--manifest, the cache directory) are still read
from the current directory.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from imageforge import uptodate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    # Before anything else is imported: a build with nothing to do is answered from its
    # record, and a build that ends up to date can record exactly what it read.
    uptodate.start_watching()
    if uptodate.answer(sys.argv[1:]):
        return
    from importlib.metadata import PackageNotFoundError, version

    from invoke.program import Program

    from imageforge import log

    tasks_file = ROOT / "tasks.py"
    if not tasks_file.is_file():
        print(log.error_line(f"no tasks.py in {ROOT}; install imageforge from a checkout "
                             "(`pip install -e <checkout>`), or run `.venv/bin/invoke` inside "
                             "one."), file=sys.stderr)
        sys.exit(1)
    spec = importlib.util.spec_from_file_location("tasks", tasks_file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tasks"] = module
    sys.path.insert(0, str(ROOT))
    spec.loader.exec_module(module)
    namespace = module.ns
    # The project configuration (invoke.yaml) beside tasks.py, as invoke finds it there.
    namespace.loaded_from = str(ROOT)
    # Without a version invoke's `--version` prints "unknown"; the installed package knows it.
    try:
        release = version("imageforge")
    except PackageNotFoundError:
        release = "unknown"
    Program(namespace=namespace, name="imageforge", binary="imageforge", version=release).run()
