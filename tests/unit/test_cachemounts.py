"""Which BuildKit records are a build's own cache mounts, read from `docker buildx du
--verbose` as Docker 26 / buildx 0.13 print it (the integration test of verify checks that
they are gone after a real rebuild)."""

from __future__ import annotations

from imageforge.buildkit.cachemounts import private_records
from imageforge.planning.execute import fresh_cache_mounts


def record(record_id: str, description: str, *, parent: str = "") -> str:
    """One record as `docker buildx du --verbose` prints it."""
    lines = [f"ID:\t\t{record_id}", *([f"Parent:\t\t{parent}"] if parent else []),
             "Created at:\t2026-12-02 10:22:03.573532975 +0000 UTC", "Mutable:\ttrue",
             "Reclaimable:\ttrue", "Shared:\t\tfalse", "Size:\t\t176.1kB",
             f"Description:\t{description}", "Usage count:\t1",
             "Last used:\t3 hours ago", "Type:\t\texec.cachemount"]
    return "\n".join(lines) + "\n"


LISTING = "\n".join([
    record("m4k04iseusv5l0zulduern7se",
           'cached mount /root/.cache/pip from exec pip install x with id "/imageforge-pip"'),
    record("k9mkoa4k8dpe27ipr4aox3hq0", "cached mount /p from exec echo -verify-3d5ccf791015 "
           'with id "/pip-verify-6a25acc0900c"'),
    record("zf4x3768qed0vqf0ib1qnqo2s", "cached mount /root/.ccache from make with id "
           '"/imageforge-ccache-verify-3d5ccf791015"', parent="ij7v5xvgowl1r2qohwqpl7tn9"),
])


def test_only_the_mounts_whose_id_carries_the_token() -> None:
    # The second record names the token in its command, not in its id: not this build's.
    assert private_records(LISTING, "3d5ccf791015") == ["zf4x3768qed0vqf0ib1qnqo2s"]
    assert private_records(LISTING, "6a25acc0900c") == ["k9mkoa4k8dpe27ipr4aox3hq0"]
    assert private_records(LISTING, "000000000000") == []
    assert private_records("", "3d5ccf791015") == []


def test_the_suffix_is_the_one_fresh_cache_mounts_gives() -> None:
    dockerfile = "RUN --mount=type=cache,id=imageforge-pip,target=/root/.cache/pip pip i x\n"
    renamed = fresh_cache_mounts(dockerfile, "3d5ccf791015")
    mount_id = renamed.split("id=", 1)[1].split(",", 1)[0]
    listing = LISTING.replace('"/imageforge-ccache-verify-3d5ccf791015"', f'"/{mount_id}"')
    assert private_records(listing, "3d5ccf791015") == ["zf4x3768qed0vqf0ib1qnqo2s"]
