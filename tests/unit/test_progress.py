"""Per-stage state from real BuildKit rawjson streams (recorded from docker buildx 0.13
building tests/unit/data/rawjson.Dockerfile cold, again cached, and with `one` failing)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from imageforge.buildkit.progress import BuildProgress, read_statuses

DATA = Path(__file__).parent / "data"


def replay(name: str, mode: str = "plain") -> tuple[BuildProgress, str, list[str]]:
    out = io.StringIO()
    other: list[str] = []
    progress = BuildProgress(["base", "one", "two"], mode, out)  # type: ignore[arg-type]
    with progress, (DATA / name).open("rb") as stream:
        for status in read_statuses(stream, other):
            progress.feed(status)
    return progress, out.getvalue(), other


def states(progress: BuildProgress) -> dict[str, str]:
    return {name: stage.state for name, stage in progress.stages.items()}


def test_cold_build_marks_every_stage_built_except_the_bare_from() -> None:
    progress, out, _ = replay("rawjson-cold.json")
    assert states(progress) == {"base": "cached", "one": "built", "two": "built"}
    assert "one                built" in out
    assert progress.stages["one"].seconds > 0
    assert "building one" in progress.stages["one"].log


def test_rebuild_with_nothing_changed_is_all_cached() -> None:
    progress, out, _ = replay("rawjson-cached.json")
    assert set(states(progress).values()) == {"cached"}
    assert "built" not in out


def test_failed_stage_keeps_its_error_and_log_and_later_stages_never_start() -> None:
    progress, _, other = replay("rawjson-failed.json")
    assert states(progress) == {"base": "cached", "one": "failed", "two": "waiting"}
    assert "exit code: 1" in (progress.stages["one"].error or "")
    assert progress.stages["one"].log[-1] == "building one"
    assert any(line.startswith("ERROR: failed to solve") for line in other)


def test_json_mode_prints_one_event_per_state_change() -> None:
    _, out, _ = replay("rawjson-cold.json", "json")
    events = [json.loads(line) for line in out.splitlines()]
    assert {(e["stage"], e["state"]) for e in events} >= {("one", "building"), ("one", "built")}
    assert all(set(e) == {"event", "stage", "state", "seconds"} for e in events)


@pytest.mark.parametrize("chunking", [1, 7, 4096])
def test_stream_reader_handles_any_chunking_and_stray_lines(chunking: int) -> None:
    text = b'warning: x\n{"vertexes": [\n {"digest": "d", "name": "[one 1/1] RUN x"}]}\n{"a": 1}'
    other: list[str] = []

    class Chunky(io.BytesIO):
        def readline(self, _size: int | None = -1) -> bytes:
            return super().readline(chunking)

    objs = list(read_statuses(Chunky(text), other))
    assert objs[1] == {"a": 1}
    assert objs[0]["vertexes"][0]["name"] == "[one 1/1] RUN x"
    assert other == ["warning: x"]


def test_padded_step_numbers_and_cancelled_copies_of_shared_steps() -> None:
    # Bake prefixes the target, pads "4/10", and cancels duplicate copies of shared steps.
    stream = json.dumps({"vertexes": [
        {"digest": "a", "name": "[image smddp  4/10] RUN x", "started": "2026-11-29T00:00:00Z",
         "completed": "2026-11-29T00:00:02Z"},
        {"digest": "b", "name": "[artifact-efa efa 1/1] RUN y",
         "started": "2026-11-29T00:00:00Z", "completed": "2026-11-29T00:00:01Z",
         "error": "context canceled"},
        {"digest": "c", "name": "[image efa 1/1] RUN y", "started": "2026-11-29T00:00:00Z",
         "completed": "2026-11-29T00:00:01Z"},
    ]}).encode()
    progress = BuildProgress(["efa", "smddp"], "plain", io.StringIO())
    with progress:
        for status in read_statuses(io.BytesIO(stream), []):
            progress.feed(status)
        progress.succeeded()
    assert states(progress) == {"efa": "built", "smddp": "built"}
    assert progress.stages["smddp"].seconds == pytest.approx(2.0)
