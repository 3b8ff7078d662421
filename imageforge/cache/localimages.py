"""Machine-local facts, kept in the local cache and never in a committed lock: the image ID
of a base image that only this machine's image store has (the sample's, made by
scripts/base-image.sh). It pins the stage keys, so stages built on an older image of the same
tag are not reused, and `build` refuses a tag that names another image since it was recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from imageforge import cachedir
from imageforge.docker import local_image_id
from imageforge.jsonfile import read_object, write_json

# read: the recorded ID, else the image store's (plans write nothing); record: the same, and
# remember it when none was recorded (builds); refresh: the image store's, remembered (lock).
Mode = Literal["read", "record", "refresh"]


class LocalImages:
    """`<cache dir>/local/images.json`: image reference -> local image ID."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cachedir.local_images(cache_dir)

    def id_for(self, ref: str, mode: Mode) -> str | None:
        recorded = self.recorded(ref)
        if recorded and mode != "refresh":
            return recorded
        found = local_image_id(ref)
        if found and found != recorded and mode != "read":
            self._record(ref, found)
        return found

    def recorded(self, ref: str) -> str | None:
        value = (read_object(self.path) or {}).get(ref)
        return value if isinstance(value, str) else None

    def _record(self, ref: str, image_id: str) -> None:
        data = {**(read_object(self.path) or {}), ref: image_id}
        write_json(self.path, data, sort_keys=True)
