"""Server-side redaction (``hotspan server --redact PATTERN``).

Agents redact before anything leaves the process; other SDKs do not, so the server can do the
same to every profile it ingests, whatever the path, just before it is stored.  Frames and
stacks are content-addressed (their ids hash their content), so a redacted frame gets a new
id, and so do the stacks and series that referenced what changed: a rewritten batch is a
batch like any other, and secrets never reach the store, not even as a hash input kept beside
an honest id.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

import numpy as np

from hotspan.model.labels import METRIC_NAME, SERVICE_NAME, normalize
from hotspan.model.profile import Frame, IngestBatch
from hotspan.model.redaction import REDACTED, RedactError
from hotspan.model.redaction import Redactor as TextRedactor

__all__ = ["REDACTED", "RedactError", "Redactor"]

# Label values kept as they are: the profile's identity, which queries and settings need.
_KEPT_LABELS = frozenset((METRIC_NAME, SERVICE_NAME))
# Verdicts remembered per distinct text: the same frame names come in every upload.
_CACHE_LIMIT = 100_000


class Redactor(TextRedactor):
    """The shared matcher (:mod:`hotspan.model.redaction`), with its verdicts remembered per
    distinct text, and applied to whole ingest batches."""

    def __init__(self, patterns: Sequence[str]) -> None:
        super().__init__(patterns)
        self._cache: Dict[str, str] = {}

    def text(self, value: str) -> str:
        out = self._cache.get(value)
        if out is None:
            out = self(value)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache = {}
            self._cache[value] = out
        return out

    def batch(self, batch: IngestBatch) -> IngestBatch:
        """``batch`` itself when nothing in it matches, else a rewritten copy."""
        stacks = batch.new_stacks(set())
        frames = batch.frames_for({f for ids in stacks.values() for f in ids})
        out = IngestBatch()
        frame_map: Dict[int, int] = {}
        for fid, frame in frames.items():
            name, filename = self.text(frame.name), self.text(frame.filename)
            if name == frame.name and filename == frame.filename:
                out.frames[fid] = frame
            else:
                frame_map[fid] = out.add_frame(Frame(name, filename, frame.line))
        series_map: Dict[int, int] = {}
        for sid, info in batch.series.items():
            labels = {
                k: v if k in _KEPT_LABELS else self.text(v) for k, v in dict(info.labels).items()
            }
            if normalize(labels) == tuple(info.labels):
                out.series[sid] = info
            else:
                series_map[sid] = out.add_series(info.profile_type, normalize(labels))
        if not frame_map and not series_map:
            return batch
        stack_map: Dict[int, int] = {}
        for sid, fids in stacks.items():
            if any(f in frame_map for f in fids):
                stack_map[sid] = out.add_stack(tuple(frame_map.get(f, f) for f in fids))
            else:
                out.stacks[sid] = fids
        cols = batch.columns()
        out.add_columns(
            cols._replace(
                series_id=_remap(cols.series_id, series_map),
                stack_id=_remap(cols.stack_id, stack_map),
            )
        )
        return out


def _remap(ids: np.ndarray, mapping: Mapping[int, int]) -> np.ndarray:
    if not mapping or not len(ids):
        return ids
    unique, inverse = np.unique(ids, return_inverse=True)
    mapped = np.array([mapping.get(i, i) for i in unique.tolist()], dtype=ids.dtype)
    return mapped[inverse.reshape(-1)]
