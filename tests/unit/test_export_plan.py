"""`build --output`: what goes into an export, and through which BuildKit exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from imageforge.app import export, project
from imageforge.app.workspace import Workspace
from imageforge.errors import UsageError
from stages import STAGES

# Manifests name their files relative to the repository root.
pytestmark = pytest.mark.usefixtures("in_repo_root")


def test_a_tar_destination_is_written_under_another_name_and_a_tree_is_streamed() -> None:
    # The export is written to DEST.part and renamed: the kind follows DEST, not DEST.part.
    assert export.output_spec(Path("/x/nccl.tar"), write_to=Path("/x/nccl.tar.part")) == \
        "type=tar,dest=/x/nccl.tar.part"
    # A tree is the tar stream on stdout, unpacked by tar: never BuildKit's local exporter,
    # which deadlocks on trees of many files.
    assert export.output_spec(Path("/x/tree"), write_to=Path("/x/tree.part")) == \
        "type=tar,dest=-"


def test_the_export_holds_each_gathered_stage_and_nothing_of_the_base() -> None:
    planned = project.plan(Workspace(registry=STAGES,
                                            manifest=Path("manifests/real-efa-nccl.toml")),
                           "efa-nccl")
    stages = export.exported_stages(planned)
    assert [s.name for s in stages] == ["efa", "nccl", "aws-ofi-nccl", "nccl-tests"]
    text = export.dockerfile(planned, stages)
    assert text.startswith("FROM scratch\n")
    assert "COPY --from=efa /opt/amazon /opt/amazon" in text
    assert "COPY --from=nccl /out/ /" in text
    assert f"COPY <<'EOF' /{export.MANIFEST_FILE}" in text


def test_a_missing_parent_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        export.check_destination(tmp_path / "no" / "tree")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        export.check_destination(tmp_path / "full")
