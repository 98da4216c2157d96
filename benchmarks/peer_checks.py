"""What the ``peers`` scenario holds every system's output against.

Pure functions: the word counts the sentences must give (computed from the
generator, not from any system), the difference of two count tables, and the
sequence check of a forward run from per-worker arrival counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from typhoon.operators.sources import generate_sentences


def expected_word_counts(count: int, seed: int, words: int, vocabulary: int) -> dict[str, int]:
    """Per word, how often the ``count`` sentences of ``sentence_source`` hold it."""
    c: Counter[str] = Counter()
    for s in generate_sentences(count, seed, words, vocabulary):
        c.update(s.split())
    return dict(c)


@dataclass(frozen=True)
class CountDiff:
    """How a count table differs from the expected one."""

    lost: int  # occurrences expected and not counted (summed over words)
    extra: int  # occurrences counted and not expected (duplicates, unknown words)
    words_wrong: int  # words whose count differs

    @property
    def equal(self) -> bool:
        return self.lost == 0 and self.extra == 0


def count_diff(expected: Mapping[str, int], got: Mapping[str, int]) -> CountDiff:
    lost = extra = wrong = 0
    for word in expected.keys() | got.keys():
        d = got.get(word, 0) - expected.get(word, 0)
        if d:
            wrong += 1
            if d > 0:
                extra += d
            else:
                lost -= d
    return CountDiff(lost, extra, wrong)


def merge_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Workers' count tables added up (a word counted on two workers adds up too)."""
    out: dict[str, int] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


@dataclass(frozen=True)
class SequenceCheck:
    """A forward run's sequence numbers ``0 .. count-1``, over all sink workers."""

    received: int
    missing: int  # numbers never seen
    duplicates: int  # arrivals beyond the first of a number
    out_of_range: int


def check_sequence(count: int, per_worker: Sequence[bytes], out_of_range: int = 0) -> SequenceCheck:
    """``per_worker[i][s]``: how often worker ``i`` saw number ``s`` (a byte, capped at 255)."""
    for seen in per_worker:
        if len(seen) != count:
            raise ValueError(f"a worker's arrival counts cover {len(seen)} numbers, not {count}")
    missing = duplicates = received = 0
    for s in range(count):
        n = sum(seen[s] for seen in per_worker)
        received += n
        if n == 0:
            missing += 1
        else:
            duplicates += n - 1
    return SequenceCheck(received + out_of_range, missing, duplicates, out_of_range)
