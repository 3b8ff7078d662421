"""Values quoted in messages, from a manifest, a --set or a lock: control characters escaped
(a value cannot forge a line of output or rewrite the terminal), long ones cut short (nor
flood a log), and a password in a URL shown nowhere, whatever brought it in. Run through the
installed `imageforge` command; the helpers themselves are checked in-process too."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from imageforge import textsafe
from imageforge.errors import FatalError, ManifestError
from tests.unit.conftest import imageforge

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret"
# Would clear the screen and print a line that looks like the tool's own.
FORGED = "a\x1b[2J\nimageforge: ok"


def manifest_in(folder: Path, edits: dict[str, str] | None = None) -> Path:
    path = folder / "smddp.toml"
    text = (ROOT / "manifests" / "smddp.toml").read_text()
    for old, new in (edits or {}).items():
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)
    return path


def one_sentence(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The sentence a failing command ends with; nothing in stdout or stderr a terminal would
    act on."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    for stream in (result.stdout, result.stderr):
        assert "\x1b" not in stream
        assert "\x00" not in stream
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def nowhere(result: subprocess.CompletedProcess[str], secret: str = SECRET) -> None:
    assert secret not in result.stdout
    assert secret not in result.stderr


# ---- passwords ------------------------------------------------------------------------------

def test_a_password_set_next_to_a_bad_key_is_shown_nowhere(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"stages.efa.url=https://user:{SECRET}@host/x.tar.gz",
                        "--set", "stages.efa.bogus=1", cwd=tmp_path)
    assert "--set stages.efa.bogus=1: unknown key" in one_sentence(result, 2)
    nowhere(result)


def test_a_password_in_the_value_of_a_bad_key_is_shown_nowhere(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"stages.efa.bogus=https://user:{SECRET}@host/x.tar.gz",
                        cwd=tmp_path)
    assert "--set stages.efa.bogus=https://***@host/x.tar.gz: unknown key" in \
        one_sentence(result, 2)
    nowhere(result)


@pytest.mark.parametrize("url", [f"https://user:{SECRET}@host/x y.tar.gz",
                                 f"https://user:{SECRET}@host/$x.tar.gz",
                                 f"https://host/x.tar.gz?sig=1&token={SECRET} x"])
def test_a_password_in_a_refused_url_is_shown_nowhere(tmp_path: Path, url: str) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"stages.efa.url={url}", cwd=tmp_path)
    assert "is not allowed" in one_sentence(result, 2)
    nowhere(result)


def test_a_password_in_a_refused_url_of_the_file_is_shown_nowhere(tmp_path: Path) -> None:
    manifest = manifest_in(tmp_path, {
        'url = "https://efa-installer.amazonaws.com/':
            f'url = "https://user:{SECRET}@host/it\'s/'})
    result = imageforge("check", "--manifest", str(manifest), cwd=tmp_path)
    assert "stages.efa.url (line" in one_sentence(result, 2)
    nowhere(result)


def test_show_hides_the_password_of_an_accepted_url(tmp_path: Path) -> None:
    result = imageforge("show", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"stages.efa.url=https://user:{SECRET}@host/x.tar.gz",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert 'url = "https://***@host/x.tar.gz"' in result.stdout
    nowhere(result)


# ---- control characters and length ----------------------------------------------------------

def test_a_set_value_cannot_forge_a_line_or_rewrite_the_terminal(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"image.platform={FORGED}", cwd=tmp_path)
    sentence = one_sentence(result, 2)
    assert "--set image.platform=a\\x1b[2J\\nimageforge: ok (over " in sentence
    assert "'a\\x1b[2J\\nimageforge: ok' is not allowed" in sentence


def test_a_quoted_key_of_the_file_cannot_forge_a_line(tmp_path: Path) -> None:
    manifest = manifest_in(tmp_path, {"[image]\n": '[image]\n"\\u001b[2J\\nok" = 1\n'})
    result = imageforge("check", "--manifest", str(manifest), cwd=tmp_path)
    assert "image.\\x1b[2J\\nok: unknown key" in one_sentence(result, 2)


def test_a_nul_in_a_value_of_the_file_is_escaped(tmp_path: Path) -> None:
    manifest = manifest_in(tmp_path, {"[image]\n": '[image]\nplatform = "x\\u0000y"\n'})
    result = imageforge("check", "--manifest", str(manifest), cwd=tmp_path)
    assert "'x\\x00y' is not allowed" in one_sentence(result, 2)


def test_an_inherit_path_cannot_rewrite_the_terminal(tmp_path: Path) -> None:
    child = tmp_path / "child.toml"
    child.write_text('inherit = "\\u001b]0;owned\\u0007.toml"\n')
    result = imageforge("check", "--manifest", str(child), cwd=tmp_path)
    assert "inherit = '\\x1b]0;owned\\x07.toml': no such manifest" in one_sentence(result, 2)


@pytest.mark.parametrize("value", ["²", "9" * 5000])
def test_a_number_int_cannot_read_is_refused_not_a_traceback(tmp_path: Path, value: str) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", f"stages.pytorch.max_jobs={value}", cwd=tmp_path)
    assert "expected a whole number of parallel jobs" in one_sentence(result, 2)


def test_a_long_value_is_cut_short(tmp_path: Path) -> None:
    result = imageforge("check", "--manifest", str(manifest_in(tmp_path)),
                        "--set", "stages.efa.version=" + "9" * 100_000 + "!", cwd=tmp_path)
    sentence = one_sentence(result, 2)
    assert "9" * 79 + textsafe.ELLIPSIS in sentence
    assert len(sentence) < 600


def test_lock_keys_and_values_are_escaped_and_cut_short(tmp_path: Path) -> None:
    manifest = manifest_in(tmp_path)
    entry = {"from": {}, "sha256": "\x1b]0;owned\x07" + "a" * 10_000}
    (tmp_path / "smddp.lock.json").write_text(json.dumps({"format": 2, FORGED: entry}))
    sentence = one_sentence(imageforge("check", "--manifest", str(manifest), cwd=tmp_path), 8)
    assert "smddp.lock.json: a\\x1b[2J\\nimageforge: ok.sha256: '\\x1b]0;owned\\x07aaa" in \
        sentence
    assert len(sentence) < 600


def test_a_lock_format_is_escaped_and_cut_short(tmp_path: Path) -> None:
    manifest = manifest_in(tmp_path)
    (tmp_path / "smddp.lock.json").write_text(json.dumps({"format": FORGED * 1000}))
    sentence = one_sentence(imageforge("check", "--manifest", str(manifest), cwd=tmp_path), 8)
    assert "is in lock format 'a\\x1b[2J\\nimageforge: ok" in sentence
    assert len(sentence) < 600


def test_a_matrix_value_is_escaped(tmp_path: Path) -> None:
    shutil.copy(ROOT / "manifests" / "smddp.toml", tmp_path)
    matrix = tmp_path / "images.toml"
    matrix.write_text('[[image]]\nmanifest = "\\u001b[2J.toml"\n')
    result = imageforge("matrix.plan", "--file", str(matrix), cwd=tmp_path)
    assert "manifest = '\\x1b[2J.toml': no such file" in one_sentence(result, 2)


# ---- the helpers ----------------------------------------------------------------------------

def test_shown_quotes_escapes_and_cuts() -> None:
    assert textsafe.shown("2.10.3") == "'2.10.3'"
    assert textsafe.shown(FORGED) == "'a\\x1b[2J\\nimageforge: ok'"
    assert textsafe.shown("x" * 200) == "'" + "x" * 79 + textsafe.ELLIPSIS
    assert textsafe.shown(["a\u202eb"]) == "['a\\u202eb']"


def test_escaped_leaves_printable_text_and_escapes_the_rest() -> None:
    assert textsafe.escaped("stages.efa.url=https://h/x é") == "stages.efa.url=https://h/x é"
    assert textsafe.escaped("a\nb\rc\td\x00e\x9bf\u2028g") == "a\\nb\\rc\\td\\x00e\\x9bf\\u2028g"
    assert textsafe.escaped("/" + "p" * 300, None) == "/" + "p" * 300
    assert textsafe.escaped("p" * 300) == "p" * 80 + textsafe.ELLIPSIS


def test_a_password_never_survives_a_cut() -> None:
    # Redacted before it is cut: a cut inside the user info must not show its first half.
    url = "https://" + "t" * 70 + f":{SECRET}@host/x"
    assert textsafe.shown(url) == "'https://***@host/x'"
    assert textsafe.escaped(url, 20) == "https://***@host/x"


@pytest.mark.parametrize("text", [
    f"--set a=https://user:{SECRET}@host/x: unknown key",
    f"'https://user:{SECRET}@host/x' is not allowed",
    f"(https://user:pa'{SECRET}@host/x)",
    f"cannot read https://host/x?X-Amz-Signature={SECRET}&a=1.",
])
def test_every_fatal_message_hides_url_credentials(text: str) -> None:
    message = str(ManifestError(text))
    assert SECRET not in message
    assert "***" in message


def test_the_sentence_around_a_redacted_url_is_kept() -> None:
    assert str(FatalError(f"cannot read https://h/x?token={SECRET}; retry (or 'https://u:"
                          f"{SECRET}@h/y').")) == \
        "cannot read https://h/x?token=***; retry (or 'https://***@h/y')."


def test_a_message_without_credentials_is_left_as_written() -> None:
    text = "stages.efa.url: 'https://host/x.tar.gz' (line 3) is not allowed; see docs."
    assert str(FatalError(text)) == text


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "2\x1b[2J"])
def test_a_count_that_is_no_small_number_is_refused_in_one_sentence(tmp_path: Path,
                                                                    value: str) -> None:
    # "²" passes str.isdigit() but not int(), and int() parses no string of 5000 digits:
    # both ended `nightly --verify` with a traceback.
    manifest = manifest_in(tmp_path)
    line = one_sentence(imageforge("nightly", "--manifest", str(manifest), "--verify", value,
                                   cwd=tmp_path), 1)
    assert "give a number of stages" in line
    assert len(line) < 200
