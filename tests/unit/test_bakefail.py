"""`bakefail.cause`: the end of BuildKit's last error line, whole, and nothing before it
(the registry URLs and upload tokens BuildKit prints there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imageforge.buildkit.bakefail import cause, explain
from imageforge.docker import BUILDX_MISSING
from imageforge.errors import DockerError

TOKEN = "Zm9vYmFyLXVwbG9hZC10b2tlbi0xMjM0NTY3ODkw"
UPLOAD = (f"https://registry.example:5000/v2/x/blobs/uploads/0c6a9e1c-5d3e-4b8f?_state={TOKEN}"
          "&digest=sha256:" + "ab" * 32)


@pytest.mark.parametrize(("output", "expected"), [
    (f"#12 exporting to image\n#12 ERROR: failed to push registry.example:5000/x:tag: failed "
     f"to copy: unexpected status from PUT request to {UPLOAD}: 500 Internal Server Error\n"
     f"ERROR: failed to solve: failed to push registry.example:5000/x:tag: failed to copy: "
     f"unexpected status from PUT request to {UPLOAD}: 500 Internal Server Error\n",
     "500 Internal Server Error"),
    (f"ERROR: failed to solve: failed to do request: Put \"{UPLOAD}\": dial tcp "
     "127.0.0.1:5000: connect: connection refused",
     "connection refused"),
    (f"ERROR: failed to solve: failed to copy: failed to do request: Put \"{UPLOAD}\": EOF",
     "failed to do request: EOF"),
    ("", "no output"),
])
def test_cause_is_the_whole_cause_without_urls_or_tokens(output: str, expected: str) -> None:
    found = cause(output)
    assert found == expected
    assert TOKEN not in found
    assert "registry.example" not in found
    assert "_state" not in found


def test_a_docker_cli_without_buildx_is_named_before_anything_else(tmp_path: Path) -> None:
    # A build no longer asks `docker buildx version` first (a CLI run per build): the bake's
    # own failure names the missing plugin, exit 6, without asking the daemon anything.
    error = explain("docker: 'buildx' is not a docker command.\nSee 'docker --help'",
                    cache=tmp_path)
    assert isinstance(error, DockerError)
    assert str(error) == BUILDX_MISSING
    assert error.return_code == 6
