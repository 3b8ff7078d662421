"""The one subprocess chokepoint (imageforge/cmd.py) and the one logger (imageforge/log.py):
commands echoed at debug level with URLs redacted, typed errors for a missing program or a
command out of time, warnings as `imageforge: warning:` lines on stderr, and no module of the
engine starting a program any other way."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from imageforge import cmd, log
from imageforge.errors import CacheError, SourceError

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", **env}, check=False,
                          timeout=60)


def test_commands_are_echoed_at_debug_level_with_secrets_redacted() -> None:
    code = ("from imageforge import cmd; "
            "cmd.run(['true', 'https://user:pw@host/x?token=abc', 'plain'])")
    shown = run_python(code, IMAGEFORGE_LOG="debug")
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == "imageforge: debug: + true 'https://***@host/x?token=***' plain\n"
    assert run_python(code).stderr == ""        # the default level says nothing


def test_a_missing_program_is_the_callers_error_naming_it() -> None:
    with pytest.raises(SourceError) as caught:
        cmd.run(["imageforge-no-such-program", "x"], error=SourceError,
                missing="install it with apt-get")
    assert str(caught.value) == ("imageforge-no-such-program is not installed or not on "
                                 "PATH; install it with apt-get")
    with pytest.raises(SourceError, match="imageforge-no-such-program is not installed"):
        cmd.popen(["imageforge-no-such-program"], error=SourceError)


def test_running_out_of_time_is_the_callers_error_when_it_words_it() -> None:
    with pytest.raises(CacheError) as caught:
        cmd.run(["sleep", "5"], timeout=0.2, error=CacheError, timed_out="the registry hung")
    assert str(caught.value) == "the registry hung"
    with pytest.raises(subprocess.TimeoutExpired):
        cmd.run(["sleep", "5"], timeout=0.2)


def test_output_is_captured_and_a_failure_is_returned_not_raised() -> None:
    result = cmd.run(["sh", "-c", "echo out; echo err >&2; exit 3"], text=True)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


def test_warnings_and_notes_go_to_stderr_with_the_prefix(
        capsys: pytest.CaptureFixture[str]) -> None:
    log.warning("the remote cache is unreachable")
    log.note("waiting for a lock")
    log.debug("not shown at the default level")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("imageforge: warning: the remote cache is unreachable\n"
                            "imageforge: note: waiting for a lock\n")


def test_no_engine_module_starts_a_program_but_cmd() -> None:
    found = []
    for path in sorted((ROOT / "imageforge").rglob("*.py")):
        if path.name == "cmd.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "subprocess"
                    and node.func.attr in ("run", "Popen", "call", "check_call",
                                           "check_output")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_no_engine_module_prints_a_warning_itself() -> None:
    found = [f"{p.relative_to(ROOT)}" for p in sorted((ROOT / "imageforge").rglob("*.py"))
             if "print(f\"imageforge: warning" in p.read_text()]
    assert found == []
