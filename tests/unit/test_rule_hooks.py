"""The rule and lock-pin hooks as a team's stage uses them: a data file without the rule's
entry is refused naming the file and the entry; a note is judged with the registry; a stage
with several lock pins gets each one; `Field.same_as` fills a field from [image]."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from imageforge.errors import ManifestError
from imageforge.model import compat
from imageforge.model.compat import Note, Rule, Violation
from imageforge.model.lockpin import LockPin, Upstream
from imageforge.model.manifest import Manifest, load
from imageforge.model.stage import Field, Stage
from imageforge.sources import locksettle
from stages import STAGES
from tests.unit.conftest import ROOT
from tests.unit.test_mut_lock import Recording

SMDDP = ROOT / "manifests/smddp.toml"


def _judge(_manifest: Manifest, _rule: Rule, _registry: compat.Registry) -> list[Violation]:
    return []


def test_a_rule_whose_data_file_lacks_its_entry_is_refused_naming_both(tmp_path: Path) -> None:
    data = tmp_path / "team_rules.toml"
    data.write_text('[rules.other]\nsource = "s"\nfix = "f"\n')
    stage = dataclasses.replace(STAGES["boost"], rules=(
        Rule(id="team-rule", judge=_judge, data=data),))
    with pytest.raises(ManifestError) as info:
        compat.check(load(SMDDP, registry=STAGES), registry={"boost": stage})
    assert str(info.value) == (f"{data}: unusable compatibility data (KeyError: "
                               "'rules.team-rule'); fix that entry or restore the file from git.")


def test_a_note_is_judged_with_the_registry_it_is_given(tmp_path: Path) -> None:
    def count(_manifest: Manifest, _note: Note, registry: compat.Registry) -> list[str]:
        return [f"{len(registry)} stages: {', '.join(sorted(registry))}"]

    stage = dataclasses.replace(STAGES["boost"], rules=(Note(judge=count, data=tmp_path),))
    registry = {"boost": stage, "base": STAGES["base"]}
    assert compat.notes(load(SMDDP, registry=STAGES), registry=registry) == [
        "2 stages: base, boost"]


def _pin(entry: str, reads: tuple[str, ...], applied: list[str], *,
         known: bool = True) -> LockPin:
    def origin(manifest: Manifest, registry: Mapping[str, Stage]) -> Mapping[str, Any] | None:
        if not known:
            return None     # what it reads has no pin yet
        return {"pytorch": str(registry["pytorch"].name), "version": str(
            manifest.stages["pytorch"]["version"])}

    def resolve(_manifest: Manifest, registry: Mapping[str, Stage], _where: Upstream
                ) -> Mapping[str, Any]:
        return {"stages": len(registry)}

    def apply(manifest: Manifest, pin: Mapping[str, Any]) -> Manifest:
        applied.append(f"{entry}={pin['stages']}")
        return manifest

    return LockPin(entry=entry, reads=reads, origin=origin, resolve=resolve, apply=apply,
                   describe=lambda _a, _b: entry)


class _Resolving(Recording):
    """Resolves every pin from its name (test_mut_lock's resolver), and lock pins the way
    lockresolve.Upstream does: through the pin's own resolve, with the registry settle passed on."""

    def lock_pin(self, pin: object, manifest: object, registry: object, old: object
                 ) -> dict[str, object]:
        assert isinstance(pin, LockPin)
        assert isinstance(manifest, Manifest)
        if pin.entry not in ("team_pin", "team_pin_2"):
            return super().lock_pin(pin, manifest, registry, old)  # type: ignore[arg-type]
        return dict(pin.resolve(manifest, registry,  # type: ignore[arg-type]
                                Upstream(locate=str, mirrors=Path())))


def test_each_lock_pin_of_a_stage_is_settled_when_the_one_before_it_is_not() -> None:
    applied: list[str] = []
    boost = dataclasses.replace(STAGES["boost"], lock_pins=(
        _pin("needs_an_absent_stage", ("no-such-stage",), applied),
        _pin("waits_for_a_pin", ("pytorch",), applied, known=False),
        _pin("team_pin", ("pytorch",), applied),
        _pin("team_pin_2", ("pytorch",), applied)))
    registry = {**STAGES, "boost": boost}
    manifest = load(SMDDP, registry=registry)
    first = locksettle.settle(manifest, None, registry)
    assert ("team_pin",) in first.unresolved
    assert ("team_pin_2",) in first.unresolved
    assert ("waits_for_a_pin",) in first.unresolved
    settled = locksettle.settle(manifest, None, registry, _Resolving())  # type: ignore[arg-type]
    assert applied == [f"team_pin={len(registry)}", f"team_pin_2={len(registry)}"]
    assert settled.pins()["team_pin"] == {"stages": len(registry)}
    assert "needs_an_absent_stage" not in settled.pins()
    assert ("waits_for_a_pin",) in settled.unresolved


def test_a_same_as_field_is_filled_from_the_image_where_the_table_has_none() -> None:
    from imageforge.model.inputs import stage_inputs

    python = STAGES["python"]
    assert python.fields["version"].same_as == "python"
    manifest = load(SMDDP, registry=STAGES)
    given = dataclasses.replace(manifest, stages={**manifest.stages,
                                                  "python": {"version": "3.99"}})
    # A table's own value is kept (the manifest check has made them equal already).
    assert stage_inputs(given, python, "smddp")["version"] == "3.99"
    bare = dataclasses.replace(manifest, stages={k: v for k, v in manifest.stages.items()
                                                 if k != "python"})
    assert stage_inputs(bare, python, "smddp")["version"] == manifest.image["python"]
    assert Field(kind="text", help="h").same_as is None
