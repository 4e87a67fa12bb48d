"""Which samples of a batch have a stack holding a matching function, in array operations.

A rule remembers its verdict per stack id (:class:`FunctionFilter`): the stack id names its
frames and a frame id its function, so an agent's uploads, which repeat the same few hundred
stacks, cost one dictionary look-up per distinct stack of a batch.  Only a batch bringing
stacks the rule has not seen lays its stacks out as flat frame ids with per-stack offsets
(:class:`BatchStacks`, shared by every function-filtered rule of the batch's tenant); the
rule then says which of the batch's distinct frames match (remembered per frame id, its
regex run once per function name of the batch), and ``np.logical_or.reduceat`` over the
offsets turns that into a verdict per stack.  Laying the stacks out (a sort of every frame
position) cost several times the rest of the counting, hence the verdicts per stack.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Set

import numpy as np

from hotspan.model.labels import Matcher
from hotspan.model.profile import Frame, IngestBatch

# A rule forgets the frames (stacks) it has judged past this many (a long-running server meets
# new ones with every deploy); it judges them again on their next appearance.
FRAME_CACHE_LIMIT = 500_000
STACK_CACHE_LIMIT = 500_000

_EMPTY = np.zeros(0, dtype=np.int64)


class BatchStacks:
    """The stacks of one batch as flat arrays, and where each sample's stack is in them."""

    def __init__(self, batch: IngestBatch, sample_stacks: np.ndarray) -> None:
        ids, lengths, flat = [], [], []
        if batch.stacks:
            n = len(batch.stacks)
            ids.append(np.fromiter(batch.stacks.keys(), np.int64, n))
            lens = np.fromiter((len(f) for f in batch.stacks.values()), np.int64, n)
            lengths.append(lens)
            flat.append(
                np.fromiter(
                    itertools.chain.from_iterable(batch.stacks.values()), np.int64, int(lens.sum())
                )
            )
        for chunk in batch.stack_chunks:
            offsets = np.asarray(chunk.offsets, dtype=np.int64)
            ids.append(np.asarray(chunk.ids, dtype=np.int64))
            lengths.append(np.diff(offsets))
            flat.append(np.asarray(chunk.frames[offsets[0] : offsets[-1]], dtype=np.int64))
        entry_ids = np.concatenate(ids) if ids else _EMPTY
        self.lengths = np.concatenate(lengths) if lengths else _EMPTY
        flat_frames = np.concatenate(flat) if flat else _EMPTY
        self.starts = np.cumsum(self.lengths) - self.lengths
        # Distinct frames, and each flat position's index among them: a rule's verdict per
        # distinct frame spreads to every position with one gather.
        self.frames, self.frame_index = np.unique(flat_frames, return_inverse=True)
        # Each sample's stack entry (entries repeat: any one of a stack's will do); -1: the
        # batch does not hold the stack, which then holds no match.
        self.sample_entry = np.full(len(sample_stacks), -1, dtype=np.int64)
        if len(entry_ids):
            order = np.argsort(entry_ids, kind="stable")
            sorted_ids = entry_ids[order]
            pos = np.minimum(np.searchsorted(sorted_ids, sample_stacks), len(sorted_ids) - 1)
            found = sorted_ids[pos] == sample_stacks
            self.sample_entry[found] = order[pos[found]]

    def sample_hits(self, frame_matches: np.ndarray) -> np.ndarray:
        """Per sample: does its stack hold a frame for which ``frame_matches`` (one flag per
        distinct frame, in :attr:`frames` order) is true."""
        hits = np.zeros(len(self.lengths), dtype=bool)
        nonempty = self.lengths > 0
        if len(self.frame_index) and nonempty.any() and frame_matches.any():
            per_position = frame_matches[self.frame_index]
            # Reducing from each non-empty stack's start to the next one's covers exactly its
            # frames (empty stacks take no positions); an empty stack would wrongly get the
            # flag at its start, hence the mask.
            hits[nonempty] = np.logical_or.reduceat(per_position, self.starts[nonempty])
        known = self.sample_entry >= 0
        out = np.zeros(len(self.sample_entry), dtype=bool)
        out[known] = hits[self.sample_entry[known]]
        return out

    def sample_settled(self, frame_judged: np.ndarray) -> np.ndarray:
        """Per sample: does the batch hold its stack, with a verdict on every frame of it
        (``frame_judged``, one flag per distinct frame): only then is the stack's verdict
        final, a frame the batch could not name being judged later."""
        settled = np.ones(len(self.lengths), dtype=bool)
        nonempty = self.lengths > 0
        if len(self.frame_index) and nonempty.any():
            per_position = frame_judged[self.frame_index]
            settled[nonempty] = np.logical_and.reduceat(per_position, self.starts[nonempty])
        known = self.sample_entry >= 0
        out = np.zeros(len(self.sample_entry), dtype=bool)
        out[known] = settled[self.sample_entry[known]]
        return out


class FrameNames:
    """Frame names of one batch, asked of it once for all rules (pprof names frames lazily)."""

    def __init__(self, batch: IngestBatch) -> None:
        self.batch = batch
        self.names: Dict[int, Frame] = {}
        self._asked: Set[int] = set()

    def ask(self, wanted: Set[int]) -> None:
        missing = wanted - self._asked
        if missing:
            self._asked |= missing
            self.names.update(self.batch.frames_for(missing))


class FunctionFilter:
    """A rule's function-name regex with the verdicts it has reached per frame id and per
    stack id."""

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.judged = _EMPTY  # sorted frame ids whose names were matched
        self.matched = _EMPTY  # sorted: those that matched
        self.stacks: Dict[int, bool] = {}  # stack id -> holds a matching frame

    def stack_verdicts(self, stack_ids: List[int]) -> Optional[np.ndarray]:
        """The remembered verdict of each of ``stack_ids``; None if one is unknown."""
        known = self.stacks
        try:
            return np.array([known[s] for s in stack_ids], dtype=bool)
        except KeyError:
            return None

    def remember_stacks(self, stack_ids: List[int], hits: np.ndarray, settled: np.ndarray) -> None:
        """Remember the verdicts of the stacks flagged ``settled``, and every match (a
        matching frame stays matching whatever the stack's other frames turn out to be)."""
        if len(self.stacks) + len(stack_ids) > STACK_CACHE_LIMIT:
            self.stacks.clear()
        for sid, hit, final in zip(stack_ids, hits.tolist(), settled.tolist()):
            if final or hit:
                self.stacks[sid] = hit

    def unjudged(self, frames: np.ndarray) -> np.ndarray:
        """Of ``frames`` (sorted, distinct), those without a verdict yet."""
        if len(self.judged) + len(frames) > FRAME_CACHE_LIMIT:
            self.judged = self.matched = _EMPTY
        return frames[~np.isin(frames, self.judged, assume_unique=True)]

    def judge(self, frames: np.ndarray, names: Dict[int, Frame]) -> None:
        """Match the names of ``frames``; a frame the batch cannot name stays unjudged."""
        named = [f for f in frames.tolist() if f in names]
        verdicts: Dict[str, bool] = {}  # frames of one function differ by line only
        hits = []
        for f in named:
            name = names[f].name
            hit = verdicts.get(name)
            if hit is None:
                hit = verdicts[name] = self.matcher.matches(name)
            if hit:
                hits.append(f)
        if named:
            self.judged = np.union1d(self.judged, np.array(named, dtype=np.int64))
        if hits:
            self.matched = np.union1d(self.matched, np.array(hits, dtype=np.int64))

    def frame_matches(self, frames: np.ndarray) -> np.ndarray:
        return np.isin(frames, self.matched, assume_unique=True)

    def frame_judged(self, frames: np.ndarray) -> np.ndarray:
        return np.isin(frames, self.judged, assume_unique=True)
