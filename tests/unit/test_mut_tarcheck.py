"""How the tarball check names a bad link (imageforge/sources/tarcheck.py): symlink or hard
link, and which directory each kind's target is relative to; on real tar files."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from imageforge.errors import SourceError
from imageforge.sources.tarcheck import check, first_problem


def _tar(path: Path, *members: tuple[str, bytes | None, str | None, bytes]) -> Path:
    """(name, type, linkname, data) for each member; type None is a regular file."""
    with tarfile.open(path, "w") as archive:
        for name, kind, link, data in members:
            info = tarfile.TarInfo(name)
            if kind is not None:
                info.type = kind
                info.linkname = link or ""
            else:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if kind is None else None)
    return path


def test_absolute_link_targets_are_named_by_kind(tmp_path: Path) -> None:
    sym = _tar(tmp_path / "s.tar", ("d/l", tarfile.SYMTYPE, "/etc/passwd", b""))
    assert first_problem(sym) == ("d/l", "is a symlink to the absolute path '/etc/passwd'")
    hard = _tar(tmp_path / "h.tar", ("f", None, None, b"x"),
                ("h", tarfile.LNKTYPE, "/etc/passwd", b""))
    assert first_problem(hard) == ("h", "is a hard link to the absolute path '/etc/passwd'")


def test_a_symlink_is_relative_to_its_directory_a_hard_link_to_the_root(tmp_path: Path) -> None:
    inside = _tar(tmp_path / "ok.tar", ("x", None, None, b"x"),
                  ("d/l", tarfile.SYMTYPE, "../x", b""))
    assert first_problem(inside) is None
    out = _tar(tmp_path / "out.tar", ("d/x", None, None, b"x"),
               ("d/h", tarfile.LNKTYPE, "../x", b""))
    assert first_problem(out) == ("d/h", "is a hard link to '../x', outside the archive's tree")
    sym_out = _tar(tmp_path / "sym-out.tar", ("d/l", tarfile.SYMTYPE, "../../x", b""))
    assert first_problem(sym_out) == ("d/l",
                                      "is a symlink to '../../x', outside the archive's tree")


def _links(path: Path, *links: tuple[str, str]) -> Path:
    return _tar(path, *((name, tarfile.SYMTYPE, target, b"") for name, target in links))


def test_each_kind_of_bad_member_is_named(tmp_path: Path) -> None:
    cases = [
        (("/abs", None, None, b"x"), "has an absolute path"),
        (("a/../x", None, None, b"x"), "has a '..' path component"),
        (("../evil", tarfile.SYMTYPE, "x", b""), "has a '..' path component"),
        (("dev", tarfile.CHRTYPE, None, b""), "is a device file"),
        (("blk", tarfile.BLKTYPE, None, b""), "is a device file"),
        (("pipe", tarfile.FIFOTYPE, None, b""), "is a fifo"),
    ]
    for i, (member, why) in enumerate(cases):
        assert first_problem(_tar(tmp_path / f"{i}.tar", member)) == (member[0], why)


def test_a_link_inside_the_tree_through_its_own_directory_is_fine(tmp_path: Path) -> None:
    assert first_problem(_links(tmp_path / "ok.tar", ("a/b/l", "../../x"))) is None


def test_symlinked_directories_are_followed_at_any_depth(tmp_path: Path) -> None:
    out = _links(tmp_path / "out.tar", ("a/b", ".."), ("a/b/c", "../.."))
    assert first_problem(out) == ("a/b/c", "is a symlink to '../..', outside the archive's tree")
    through = _links(tmp_path / "through.tar", ("sub/up", ".."), ("x", "sub/up/../.."))
    assert first_problem(through) == ("x", "is a symlink to 'sub/up/../..', outside the "
                                           "archive's tree")
    empty_parts = _links(tmp_path / "empty.tar", ("l", "sub//../.."))
    assert first_problem(empty_parts) == ("l", "is a symlink to 'sub//../..', outside the "
                                               "archive's tree")


def test_a_directory_that_later_becomes_a_symlink_is_caught(tmp_path: Path) -> None:
    late = _links(tmp_path / "late.tar", ("a/b/l", "../../x"), ("a/b", "."))
    assert first_problem(late) == ("a/b/l", "is a symlink to '../../x', outside the "
                                            "archive's tree")


def test_forty_hops_are_followed_and_more_count_as_a_loop(tmp_path: Path) -> None:
    chain = [(f"s{i}", f"s{i + 1}") for i in range(41, 0, -1)]  # s41 -> s42 ... s1 -> s2
    chain[0] = ("s41", "f")
    ok = _tar(tmp_path / "ok.tar", ("f", None, None, b"x"),
              *((n, tarfile.SYMTYPE, t, b"") for n, t in chain))
    assert first_problem(ok) is None  # s1's target s2 takes 40 hops
    looping = _tar(tmp_path / "loop.tar", ("f", None, None, b"x"),
                   *((n, tarfile.SYMTYPE, t, b"") for n, t in [*chain, ("s0", "s1")]))
    assert first_problem(looping) == ("s0", "is a symlink to 's1', outside the archive's tree")
    cycle = _links(tmp_path / "cycle.tar", ("a", "b"), ("b", "a"))
    assert first_problem(cycle) is not None


def test_check_names_the_source_origin_and_member(tmp_path: Path) -> None:
    bad = _tar(tmp_path / "bad.tar", ("/etc/x", None, None, b"x"))
    with pytest.raises(SourceError) as info:
        check(bad, source="src-efa", origin="https://h/efa.tar")
    assert str(info.value) == (
        "source src-efa (https://h/efa.tar) was refused: member '/etc/x' has an absolute "
        "path, so unpacking it could write outside its directory; nothing was kept, check "
        "where this release came from before pinning it.")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(SourceError) as info:
        check(junk, source="src-efa", origin="https://h/efa.tar")
    assert str(info.value).startswith("source src-efa (https://h/efa.tar) is not a readable "
                                      "tar archive (")
    assert str(info.value).endswith("); it was not kept, check the file upstream and its pin.")
    check(_tar(tmp_path / "good.tar", ("f", None, None, b"x")), source="s", origin="o")


def test_a_truncated_compressed_tarball_is_unreadable(tmp_path: Path) -> None:
    whole = tmp_path / "whole.tar.gz"
    with tarfile.open(whole, "w:gz") as archive:
        info = tarfile.TarInfo("f")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[:-4])  # the gzip trailer's length field is gone
    assert first_problem(whole) is None
    with pytest.raises(EOFError):
        first_problem(cut)


def test_what_only_tarfiles_data_filter_refuses_is_refused_too(tmp_path: Path) -> None:
    # Through the archive's own link, l1/../.. is d/e/../.. (the root); read literally, as
    # the data filter reads it, it leaves the directory.
    literal = _links(tmp_path / "literal.tar", ("l1", "d/e"), ("x", "l1/../.."))
    name, why = first_problem(literal) or ("", "")
    assert name == "x"
    assert why.startswith("is refused by tarfile's data filter ('x' would link to ")


def test_a_member_behind_a_looping_symlink_is_refused(tmp_path: Path) -> None:
    loop = _tar(tmp_path / "loop.tar", ("a", tarfile.SYMTYPE, "a", b""), ("a/f", None, None, b"x"))
    assert first_problem(loop) == (
        "a/f", "lies behind a symlink that leads outside the archive's tree (or loops)")


def test_a_member_of_an_unknown_type_is_a_special_file(tmp_path: Path) -> None:
    odd = _tar(tmp_path / "odd.tar", ("v", b"Z", "", b""))
    assert first_problem(odd) == ("v", "is a special file")


def test_a_symlink_named_dir_dot_is_no_link_through_which_later_members_resolve(
        tmp_path: Path) -> None:
    # "d/." names the directory d itself: tar cannot make it a symlink (it fails on it), so
    # its target is never followed, also once d itself becomes a harmless link to ".".
    archive = _links(tmp_path / "dot.tar", ("d/.", "../x"), ("d", "."))
    assert first_problem(archive) is None


def test_a_trailing_slash_does_not_move_a_symlink_into_its_own_directory(
        tmp_path: Path) -> None:
    # tarfile extracts a symlink member "a/b/" as a/b (data filter and all): "../.." from a/
    # leaves the tree, though from inside a/b it would not.
    out = _links(tmp_path / "out.tar", ("a/b/", "../.."))
    assert first_problem(out) == ("a/b/", "is a symlink to '../..', outside the archive's tree")
    inside = _tar(tmp_path / "in.tar", ("a/x", None, None, b"x"),
                  ("a/b/", tarfile.SYMTYPE, "x", b""))
    assert first_problem(inside) is None
    # Later members resolve through it from where it really is: a/b -> .. is the root, so
    # a/b/c -> ../x leaves the tree.
    through = _tar(tmp_path / "through.tar", ("a/b/", tarfile.SYMTYPE, "..", b""),
                   ("a/b/c", tarfile.SYMTYPE, "../x", b""))
    assert first_problem(through) == ("a/b/c", "is a symlink to '../x', outside the archive's tree")


def test_only_slashes_are_stripped_from_a_members_name(tmp_path: Path) -> None:
    # "a/X" -> "../y" is a/X pointing at y in the root: inside. Judged as if it were "a"
    # (a name stripped of more than its slashes), it would point outside.
    assert first_problem(_links(tmp_path / "x.tar", ("a/X", "../y"))) is None
