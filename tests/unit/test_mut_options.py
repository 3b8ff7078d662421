"""A command's options (imageforge/app/options.py), in process: which invoke.yaml settings and
INVOKE_IMAGEFORGE_* variables are refused and how each refusal reads, where the cache
directory may be, which flag or setting a CA bundle is blamed on, and the bounds and messages
of every flag value checked before any work."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from imageforge.app import options
from imageforge.errors import CacheError, ManifestError, UsageError
from imageforge.model.stage import Stage
from stages import STAGES
from tests.unit.test_mut_artifacts_records import _as_another_user

SETTINGS = ("manifest, cache_dir, remote, rewrite, repository, webhook, layer_cache, "
            "ca_bundle, stage_dirs, image_artifacts, cache_trust")
VARIABLES = ", ".join(f"INVOKE_IMAGEFORGE_{k.upper()}" for k in SETTINGS.split(", "))
CACHE_DIR = "imageforge.cache_dir (invoke.yaml or INVOKE_IMAGEFORGE_CACHE_DIR)"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _discover(_dirs: object) -> Mapping[str, Stage]:
    return STAGES


def config(table: Any = None, environ: Mapping[str, str] | None = None) -> options.Config:
    return options.Config(table={} if table is None else table, discover=_discover,
                          environ={} if environ is None else environ)


def _usage(work: Any) -> str:
    with pytest.raises(UsageError) as info:
        work()
    assert info.value.return_code == 1
    return str(info.value)


# ---- Config: what invoke's configuration may hold -------------------------------------------


def test_the_settings_list_in_messages_is_every_setting_in_order() -> None:
    assert ", ".join(options.CONFIG_DEFAULTS) == SETTINGS


def test_a_table_that_is_not_a_mapping_is_refused_with_where_to_write_settings() -> None:
    assert _usage(lambda: config(["remote", "x"])) == (
        "imageforge in the invoke config is ['remote', 'x'], not a table of settings; write "
        "`imageforge:` with `key: value` lines under it in invoke.yaml.")


def test_a_setting_that_is_not_a_string_is_refused_naming_it() -> None:
    assert _usage(lambda: config({"remote": 3})) == (
        "imageforge.remote in the invoke config is 3; give a string in invoke.yaml.")
    assert _usage(lambda: config({"cache_trust": ["verified"] * 20})) == (
        "imageforge.cache_trust in the invoke config is ['verified', 'verified', 'verified', "
        "'verified', 'verified',; give a string in invoke.yaml.")


def test_an_empty_setting_and_list_settings_are_accepted() -> None:
    given = {"remote": None, "manifest": "m.toml", "stage_dirs": ["a", "b"],
             "rewrite": [{"prefix": "a", "replace": "b"}]}
    assert config(given).table == given
    assert config({"remote": None}).get("remote") is None


@pytest.mark.parametrize(("key", "hint"), [
    ("remotee", " (did you mean remote?)"),
    ("cache-dir", " (did you mean cache_dir?)"),
    ("zzz", ""),
    (7, ""),
])
def test_an_unknown_setting_is_refused_with_the_closest_one_and_every_setting(
        key: object, hint: str) -> None:
    assert _usage(lambda: config({key: "x"})) == (
        f"imageforge.{key} in the invoke config is not a setting{hint}; the settings are "
        f"{SETTINGS}.")


@pytest.mark.parametrize(("name", "hint"), [
    ("INVOKE_IMAGEFORGE_REMOTEE", " (did you mean INVOKE_IMAGEFORGE_REMOTE?)"),
    ("INVOKE_IMAGEFORGE_CACHEDIR", " (did you mean INVOKE_IMAGEFORGE_CACHE_DIR?)"),
    ("INVOKE_IMAGEFORGE_" + "Q" * 30, ""),
])
def test_an_unknown_variable_is_refused_with_the_closest_one_and_every_variable(
        name: str, hint: str) -> None:
    assert _usage(lambda: config(environ={"HOME": "/root", name: "x"})) == (
        f"${name} is not a setting{hint}; unset it, or use one of {VARIABLES}.")


def test_known_variables_and_other_variables_are_accepted() -> None:
    made = config(environ={"INVOKE_IMAGEFORGE_REMOTE": "r.example/c", "INVOKE_OTHER": "1",
                           "IMAGEFORGE_X": "2"})
    assert made.get("remote") == "r.example/c"


# ---- the closest name ---------------------------------------------------------------------


def test_closest_offers_the_single_best_match_or_nothing() -> None:
    assert options._closest("remotee", ["remote", "manifest"]) == " (did you mean remote?)"
    # Two close names: the closer one.
    assert options._closest("cache_dirr", ["cache_trust", "cache_dir"]) == \
        " (did you mean cache_dir?)"
    assert options._closest("zzz", ["remote", "manifest"]) == ""
    assert options._closest("remote", []) == ""


# ---- the cache directory --------------------------------------------------------------------


def _cache_dir_error(where: str) -> str:
    with pytest.raises(CacheError) as info:
        options.cache_dir(config({"cache_dir": where}))
    assert info.value.return_code == 9
    return str(info.value)


def test_a_dangling_symlink_is_refused_naming_where_it_points(tmp_path: Path) -> None:
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "gone")
    assert _cache_dir_error(str(link)) == (
        f"{CACHE_DIR} = {link}: is a symlink to {tmp_path / 'gone'}, which does not exist; "
        "point it at a directory imageforge may write (it is created when missing).")


def test_a_file_is_refused_as_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "cache"
    path.write_text("")
    assert _cache_dir_error(str(path)) == (
        f"{CACHE_DIR} = {path}: is not a directory; point it at a directory imageforge may "
        "write (it is created when missing).")


def test_a_symlink_to_a_directory_or_a_missing_directory_is_taken(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "real")
    assert options.cache_dir(config({"cache_dir": str(link)})) == link
    assert options.cache_dir(config({"cache_dir": str(tmp_path / "new")})) == tmp_path / "new"
    assert not (tmp_path / "new").exists()
    assert options.cache_dir(config(environ={"INVOKE_IMAGEFORGE_CACHE_DIR": str(link)})) == link


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory anyone may enter (tmp_path's parents are root's alone)."""
    path = Path(tempfile.mkdtemp())
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_a_directory_the_user_may_not_write_or_enter_is_refused(shared: Path) -> None:
    locked = shared / "locked"
    locked.mkdir(mode=0o555)
    open_dir = shared / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    no_entry = shared / "no-entry"
    no_entry.mkdir()
    no_entry.chmod(0o666)

    def work() -> None:
        for path in (locked, no_entry):
            assert _cache_dir_error(str(path)) == (
                f"{CACHE_DIR} = {path}: is not writable by this user; point it at a directory "
                "imageforge may write (it is created when missing).")
        assert options.cache_dir(config({"cache_dir": str(open_dir)})) == open_dir

    # Asked here too, as this process's user: it may write the open directory.
    assert options.cache_dir(config({"cache_dir": str(open_dir)})) == open_dir
    _as_another_user(work)


# ---- the CA bundle --------------------------------------------------------------------------


@pytest.fixture
def no_bundle_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)


@pytest.mark.usefixtures("no_bundle_variables")
def test_the_flag_gives_the_bundle_and_is_blamed_for_a_bad_one(tmp_path: Path) -> None:
    bundle = tmp_path / "proxy.pem"
    bundle.write_text(PEM)
    other = tmp_path / "other.pem"
    other.write_text(PEM)
    assert options.ca_bundle(config({"ca_bundle": str(other)}), str(bundle)) == bundle
    assert options.ca_bundle(config(), "none") is None
    with pytest.raises(ManifestError) as info:
        options.ca_bundle(config({"ca_bundle": str(other)}), str(tmp_path / "missing.pem"))
    assert str(info.value) == (
        f"--ca-bundle {tmp_path / 'missing.pem'}: cannot read it (No such file or directory); "
        "give a PEM CA bundle, or `none`.")


@pytest.mark.usefixtures("no_bundle_variables")
def test_the_setting_gives_the_bundle_when_no_flag_does(tmp_path: Path) -> None:
    bundle = tmp_path / "proxy.pem"
    bundle.write_text(PEM)
    assert options.ca_bundle(config({"ca_bundle": str(bundle)}), None) == bundle
    assert options.ca_bundle(
        config(environ={"INVOKE_IMAGEFORGE_CA_BUNDLE": str(bundle)}), None) == bundle
    junk = tmp_path / "junk.pem"
    junk.write_text("junk")
    with pytest.raises(ManifestError) as info:
        options.ca_bundle(config({"ca_bundle": str(junk)}), None)
    assert str(info.value) == (
        f"imageforge.ca_bundle (invoke.yaml or INVOKE_IMAGEFORGE_CA_BUNDLE) {junk}: not a PEM "
        "CA bundle (no BEGIN CERTIFICATE); give the bundle file your proxy's CA is in, or "
        "`none`.")


# ---- image artifacts ------------------------------------------------------------------------


def test_image_artifacts_is_the_setting_else_the_image_store() -> None:
    assert options.image_artifacts(config()) == "image-store"
    assert options.image_artifacts(config({"image_artifacts": "oci-layout"})) == "oci-layout"
    assert options.image_artifacts(
        config(environ={"INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS": "oci-layout"})) == "oci-layout"
    assert _usage(lambda: options.image_artifacts(config({"image_artifacts": "disk"}))) == (
        "imageforge.image_artifacts = 'disk': give one of image-store, oci-layout (invoke.yaml "
        "or INVOKE_IMAGEFORGE_IMAGE_ARTIFACTS).")


# ---- the workspace's --mirror ---------------------------------------------------------------


@pytest.mark.parametrize("mirror", ["http://m.example/mirror", "https://m.example/m",
                                    "file:///srv/mirror", "mirror-dir", "./a:b"])
def test_a_mirror_directory_or_http_or_file_url_is_taken(tmp_path: Path, mirror: str) -> None:
    made = options.workspace(config({"cache_dir": str(tmp_path / "cache")}),
                             options.Flags(mirror=mirror))
    assert made.mirror == mirror


@pytest.mark.parametrize("mirror", ["ftp://m.example/mirror", "HTTP://m.example/m",
                                    "s3://bucket/m", "x/http://m"])
def test_a_mirror_url_of_another_scheme_is_refused(tmp_path: Path, mirror: str) -> None:
    assert _usage(lambda: options.workspace(config({"cache_dir": str(tmp_path / "cache")}),
                                            options.Flags(mirror=mirror))) == (
        f"--mirror {mirror}: give a directory mirror.sync wrote, or an http(s):// or file:// "
        "URL serving one.")


# ---- flag values ----------------------------------------------------------------------------


def test_whole_number_takes_the_minimum_and_above() -> None:
    assert options.whole_number("jobs", "1", minimum=1) == 1
    assert options.whole_number("jobs", 0, minimum=0) == 0
    assert options.whole_number("jobs", "12", minimum=1) == 12
    for value in ("0", "x", "-3"):
        assert _usage(lambda v=value: options.whole_number("jobs", v, minimum=1)) == (
            f"--jobs {value}: give a whole number of at least 1.")


def test_ratio_takes_any_finite_number_above_zero() -> None:
    assert options.ratio("factor", "0.5") == 0.5
    assert options.ratio("factor", "1") == 1.0
    for value in ("0", "-1", "inf", "nan", "x"):
        assert _usage(lambda v=value: options.ratio("factor", v)) == (
            f"--factor {value}: give a number above 0, e.g. 1.2.")


def test_count_takes_up_to_six_ascii_digits() -> None:
    assert options.count("stages", "123456") == 123456
    assert options.count("stages", "0") == 0
    for value in ("1234567", "²", "-1", "", "1\n"):
        assert _usage(lambda v=value: options.count("stages", v)) == (
            f"--stages {value.replace(chr(10), chr(92) + 'n')}: give a number of stages, e.g. 2 "
            "(0: none).")


def test_image_tag_refuses_what_docker_would_refuse_showing_80_characters() -> None:
    options.image_tag("--tag", "registry.example.com/training:2026-12-05")
    long = "A" * 100
    assert _usage(lambda: options.image_tag("--tag", long)) == (
        f"--tag {'A' * 80!r}: not an image reference; give [REGISTRY/]REPOSITORY[:TAG] in lower "
        "case, e.g. registry.example.com/training:2026-12-05.")
    assert _usage(lambda: options.image_tag("--push", "Bad/Name")) == (
        "--push 'Bad/Name': not an image reference; give [REGISTRY/]REPOSITORY[:TAG] in lower "
        "case, e.g. registry.example.com/training:2026-12-05.")


def test_code_and_program_go_together() -> None:
    assert options.code_flags(None, None) is None
    assert options.code_flags("src", "train.py") == ("src", "train.py")
    for code, program in (("src", None), (None, "train.py")):
        assert _usage(lambda c=code, p=program: options.code_flags(c, p)) == (
            "--code and --program go together: --code names the directory of the training "
            "code, --program the script in it SageMaker runs.")


def test_code_needs_a_stage_that_takes_code() -> None:
    without = {name: stage for name, stage in STAGES.items() if not stage.takes_code}
    assert _usage(lambda: options.code_stage(without)) == (
        "--code: no stage takes training code (none sets takes_code); build without --code "
        "and --program.")
    assert options.code_stage(STAGES).takes_code
