"""An in-memory, append-only copy of the stacks the queries have needed so far.

Flame graphs are built from arrays, so every stack is kept as a run of name indexes in one flat
array; finding the rows of 50,000 stack ids is then one ``searchsorted`` instead of 50,000 dict
look-ups.  Stacks and frames never change once written, so the cache never goes stale; it is
filled from the store on first use.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import numpy as np

from hotspan.model.profile import Frame
from hotspan.store.base import Store


class StackTable:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.names: List[str] = []
        self._name_index: Dict[str, int] = {}
        self.frames: Dict[int, Frame] = {}
        self._frame_name: Dict[int, int] = {}
        # One row per stack: its id, and where its root-first frames sit in the flat arrays.
        self._ids = np.zeros(0, dtype=np.int64)
        self._offsets = np.zeros(0, dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.int64)
        self._flat_names = np.zeros(0, dtype=np.int32)
        self._flat_frames = np.zeros(0, dtype=np.int64)
        self._sorted_ids = np.zeros(0, dtype=np.int64)
        self._sorted_rows = np.zeros(0, dtype=np.int64)

    def name_id(self, name: str) -> int:
        """The index of a name, added if new.  Callers hold ``_lock``."""
        idx = self._name_index.get(name)
        if idx is None:
            idx = self._name_index[name] = len(self.names)
            self.names.append(name)
        return idx

    def find_name(self, name: str) -> int:
        """The index of a known name, or -1 (never adds: queries must not grow the cache)."""
        return self._name_index.get(name, -1)

    def rows(self, stack_ids: np.ndarray) -> np.ndarray:
        """Row of each stack id (loading unknown ones); -1 for ids the store does not know."""
        with self._lock:
            rows = self._lookup(stack_ids)
            missing = rows < 0
            if missing.any():
                self._load(np.unique(stack_ids[missing]))
                rows = self._lookup(stack_ids)
        return rows

    def _lookup(self, stack_ids: np.ndarray) -> np.ndarray:
        if len(self._sorted_ids) == 0:
            return np.full(len(stack_ids), -1, dtype=np.int64)
        pos = np.searchsorted(self._sorted_ids, stack_ids)
        pos_clipped = np.minimum(pos, len(self._sorted_ids) - 1)
        found = self._sorted_ids[pos_clipped] == stack_ids
        return np.where(found, self._sorted_rows[pos_clipped], -1)

    def _load(self, stack_ids: np.ndarray) -> None:
        stacks = self._store.stacks(stack_ids.tolist())
        if not stacks:
            return
        unknown = {f for frames in stacks.values() for f in frames} - self.frames.keys()
        if unknown:
            for fid, frame in self._store.frames(list(unknown)).items():
                self.frames[fid] = frame
                self._frame_name[fid] = self.name_id(frame.name)
        unknown_name = self.name_id("unknown")
        ids: List[int] = []
        lengths: List[int] = []
        flat_frames: List[int] = []
        for sid, frames in stacks.items():
            ids.append(sid)
            lengths.append(len(frames))
            flat_frames.extend(frames)
        frame_arr = np.asarray(flat_frames, dtype=np.int64)
        name_arr = np.fromiter(
            (self._frame_name.get(f, unknown_name) for f in flat_frames),
            dtype=np.int32,
            count=len(flat_frames),
        )
        start = len(self._flat_names)
        length_arr = np.asarray(lengths, dtype=np.int64)
        offsets = start + np.concatenate(([0], np.cumsum(length_arr)[:-1]))
        self._ids = np.concatenate((self._ids, np.asarray(ids, dtype=np.int64)))
        self._offsets = np.concatenate((self._offsets, offsets))
        self._lengths = np.concatenate((self._lengths, length_arr))
        self._flat_names = np.concatenate((self._flat_names, name_arr))
        self._flat_frames = np.concatenate((self._flat_frames, frame_arr))
        order = np.argsort(self._ids, kind="stable")
        self._sorted_ids = self._ids[order]
        self._sorted_rows = order

    def matrix(self, rows: np.ndarray, frames: bool = False) -> Tuple[np.ndarray, np.ndarray]:
        """Root-first name indexes (or frame ids) of the given rows as an (n, depth) matrix
        padded with -1, and each row's length."""
        lengths = self._lengths[rows]
        depth = int(lengths.max()) if len(lengths) else 0
        cols = np.arange(depth, dtype=np.int64)
        index = self._offsets[rows][:, None] + cols[None, :]
        valid = cols[None, :] < lengths[:, None]
        source = self._flat_frames if frames else self._flat_names
        out = np.where(valid, source[np.where(valid, index, 0)] if len(source) else -1, -1)
        return out.astype(np.int64 if frames else np.int32), lengths


def stack_hits(table: StackTable, rows: np.ndarray, name_hit: np.ndarray) -> np.ndarray:
    """A boolean per row: does the stack hold a frame whose name is hit?  Reads the rows'
    frame names straight from the table's flat array (no stacks x depth matrix)."""
    if len(rows) == 0:
        return np.zeros(0, dtype=bool)
    # Rows only ever get appended (arrays replaced, never changed), so these reads agree
    # for rows the table returned, whichever arrays are current.
    lengths = table._lengths[rows]
    offsets = table._offsets[rows]
    flat = table._flat_names
    count = int(lengths.sum())
    if count == 0:
        return np.zeros(len(rows), dtype=bool)
    firsts = np.cumsum(lengths) - lengths
    index = np.arange(count, dtype=np.int64) + np.repeat(offsets - firsts, lengths)
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
    names = flat[index]
    names = np.where(names < len(name_hit) - 1, names, len(name_hit) - 1)
    hits = np.bincount(owner, weights=name_hit[names], minlength=len(rows))
    return hits > 0
