"""Bash snippets that stage checks are made of (library presence, linking, loading).

Each function returns a script that prints what it found and exits non-zero when the image
is broken. They run under `invoke test-image`, inside the image, with its environment.
"""

from __future__ import annotations

from imageforge.dockerfile import sh

# Libraries the NVIDIA container runtime mounts from the host driver when a GPU is handed to
# the container; without a GPU their absence says nothing about the image.
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")

# The first Python an image has: the conda prefix of the python stage, else the system one.
FIND_PYTHON = "py=$(command -v /opt/conda/bin/python python3 | head -n 1)"


def links(*paths: str) -> str:
    """Every file exists and ldd resolves each of its dependencies. `paths` are shell words:
    quote literal paths with `sh`, leave globs (and "$variables") to the shell."""
    ignored = "|".join(lib.replace(".", r"\.") for lib in DRIVER_LIBS)
    return "\n".join([
        "status=0",
        f"for f in {' '.join(paths)}; do",
        '  [ -f "$f" ] || { echo "$f: missing"; status=1; continue; }',
        f'  missing=$(ldd "$f" | grep "not found" | grep -Ev "^\\s*({ignored}) ")',
        '  if [ -n "$missing" ]; then echo "$f: unresolved:"; echo "$missing"; status=1;',
        '  else echo "$f: every dependency resolved"; fi',
        "done",
        "exit $status",
    ])


def links_to(path: str, library: str) -> str:
    """`path` resolves `library` to exactly that file (not another copy of it)."""
    name = library.rsplit("/", 1)[-1]
    return (f"ldd {sh(path)} | grep -F {sh(f'{name} => {library} ')} || "
            f"{{ echo {sh(f'{path} does not load {library}:')}; ldd {sh(path)}; exit 1; }}")


def dlopens(path: str) -> str:
    """dlopen (ctypes, RTLD_NOW: every symbol bound) succeeds. Images without Python get
    `ldd -r`, which binds every symbol the same way without loading the library."""
    load = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('dlopen ok:', sys.argv[1])"
    return "\n".join([
        FIND_PYTHON,
        f'if [ -n "$py" ]; then "$py" -c {sh(load)} {sh(path)}',
        f'else out=$(ldd -r {sh(path)} 2>&1); echo "$out"',
        "  ! grep -q 'undefined symbol' <<<\"$out\"",
        "fi",
    ])


def one_visible(name: str) -> str:
    """Exactly one real file `name`* (symlinks resolved) in the dynamic linker's cache and the
    LD_LIBRARY_PATH directories, the places a process finds `name` in."""
    pattern = "^" + name.replace(".", r"\.")
    return "\n".join([
        "found=$(",
        f"  {{ ldconfig -p | awk {sh(f'$1 ~ /{pattern}/ {{print $NF}}')}",
        "    IFS=:",
        "    for dir in ${LD_LIBRARY_PATH-}; do",
        f'      for lib in "${{dir:-.}}"/{name}*; do echo "$lib"; done',
        "    done",
        '  } | while read -r lib; do [ -f "$lib" ] && readlink -f "$lib"; done | sort -u)',
        'count=$(grep -c . <<<"$found")',
        f'echo "$count {name}* visible to the dynamic linker:"',
        'echo "$found"',
        '[ "$count" -eq 1 ]',
    ])
