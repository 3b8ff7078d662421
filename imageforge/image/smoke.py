"""Bash snippets that stage checks are made of (library presence, linking, loading).

Each function returns a script that prints what it found and exits non-zero when the image
is broken. They run under `invoke test-image`, inside the image, with its environment.
"""

from __future__ import annotations

from imageforge.planning.dockerfile import sh

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


# A line a check prints for the versions report: `invoke test-image` collects them into a table
# (component, pinned, found in the image). Parsed by checkreport.versions.
VERSION_MARK = "imageforge-version"


def reports_version(component: str, probe: str, pinned: str | None) -> str:
    """Run `probe` (a script printing one version), report it, and fail when a pinned version
    is given and the image has another (a prefix match: pinned "1.17" accepts "1.17.0")."""
    lines = [
        f"found=$( {probe} )",
        'found=$(printf %s "$found" | head -n 1 | tr -d "[:space:]")',
        f'echo "{VERSION_MARK}|{component}|{pinned or "-"}|${{found:-none}}"',
        '[ -n "$found" ] || { echo "no version found"; exit 1; }',
    ]
    if pinned:
        lines.append(f'case "$found" in {sh(pinned)}|{sh(pinned)}.*) ;; *) echo '
                     f'"{component} is $found in the image, pinned {pinned}"; exit 1;; esac')
    return "\n".join(lines)


# ncclGetVersion of the libnccl a process actually maps after dlopen("libnccl.so.2"), by the
# loader's own search, as a training job would load it.
LOADED_NCCL = """\
import ctypes, os
lib = ctypes.CDLL("libnccl.so.2")
code = ctypes.c_int()
assert lib.ncclGetVersion(ctypes.byref(code)) == 0, "ncclGetVersion failed"
c = code.value
parts = (c // 10000, c // 100 % 100, c % 100) if c >= 20900 else (c // 1000, c // 100 % 10, c % 100)
maps = {l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if len(l.split(None, 5)) == 6}
print(".".join(map(str, parts)), *sorted(p for p in maps if "libnccl" in os.path.basename(p)))
"""


def loaded_nccl() -> str:
    """Prints the version ncclGetVersion reports, then the libnccl file(s) mapped."""
    return f'{FIND_PYTHON}; "$py" -c {sh(LOADED_NCCL)}'


def header_nccl(include: str) -> str:
    """The version nccl.h in `include` declares."""
    return (f"awk '/define NCCL_(MAJOR|MINOR|PATCH) / {{v = v (v ? \".\" : \"\") $3}} "
            f"END {{print v}}' {sh(include + '/nccl.h')}")
