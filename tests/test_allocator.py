"""The caching allocator model (trace/derive/allocator.py) against the same rules written plainly:
every segment a list of blocks searched whole on each request. Random streams of requests of
every size class, freed in random order, under CUDA's and Apple's (MPS) constants, with and
without a device limit; and the model's own bookkeeping checked after every event."""
from __future__ import annotations

import random

import pytest

from trainplan.trace.derive.allocator import (CUDA, MPS, CachingAllocatorModel, Rules,
                                              _segment_size, replay, replay_within)

KiB, MiB = 1024, 1024 * 1024


class Plain:
    """The module docstring's rules, one list of [offset, size, live key or None] a segment."""

    def __init__(self, rules: Rules, limit: int | None = None):
        self.rules, self.limit, self.oom = rules, limit, False
        self.segs: dict[int, tuple[bool, int, list[list]]] = {}   # seg -> (small, size, blocks)
        self.where: dict[int, tuple[int, list]] = {}
        self.n = self.reserved = self.allocated = self.pinned = 0
        self.peaks = [0, 0, 0]

    def _peak(self) -> None:
        self.peaks = [max(p, v) for p, v in zip(self.peaks, (self.allocated, self.reserved,
                                                              self.pinned))]

    def malloc(self, key: int, nbytes: int) -> None:
        r = self.rules
        size = max(r.min_block, -(-nbytes // r.min_block) * r.min_block)
        small = size <= r.small_size
        fits = [(b[1], seg, b[0]) for seg, (sm, _n, blocks) in self.segs.items() if sm == small
                for b in blocks if b[2] is None and b[1] >= size]
        if fits:
            _s, seg, off = min(fits)
        else:
            need = _segment_size(size, r)
            if self.limit is not None and self.reserved + need > self.limit:
                for s, (_sm, n, blocks) in list(self.segs.items()):
                    if len(blocks) == 1 and blocks[0][2] is None:
                        del self.segs[s]
                        self.reserved -= n
                self.oom |= self.reserved + need > self.limit
            seg, off = self.n, 0
            self.n += 1
            self.segs[seg] = (small, need, [[0, need, None]])
            self.reserved += need
        blocks = self.segs[seg][2]
        i = next(j for j, b in enumerate(blocks) if b[0] == off)
        rest = blocks[i][1] - size
        if rest >= r.min_block if small else rest > r.split_large:
            blocks.insert(i + 1, [off + size, rest, None])
            blocks[i][1] = size
        if not any(b[2] is not None for b in blocks):
            self.pinned += self.segs[seg][1]
        blocks[i][2] = key
        self.allocated += blocks[i][1]
        self.where[key] = (seg, blocks[i])
        self._peak()

    def free(self, key: int) -> None:
        seg, block = self.where.pop(key)
        blocks = self.segs[seg][2]
        block[2] = None
        self.allocated -= block[1]
        if not any(b[2] is not None for b in blocks):
            self.pinned -= self.segs[seg][1]
        i = blocks.index(block)
        if i + 1 < len(blocks) and blocks[i + 1][2] is None:
            block[1] += blocks.pop(i + 1)[1]
        if i > 0 and blocks[i - 1][2] is None:
            blocks[i - 1][1] += blocks.pop(i)[1]


def _stream(seed: int, n: int = 1500) -> list[tuple[int, int]]:
    """Requests from 1 byte to 300 MiB (both pools, every segment size), each freed later in
    random order, some never (a step's weights)."""
    rng = random.Random(seed)
    sizes = [lambda: rng.randint(1, 4 * KiB), lambda: rng.randint(4 * KiB, 1 * MiB),
             lambda: rng.randint(1 * MiB, 10 * MiB), lambda: rng.randint(10 * MiB, 300 * MiB)]
    live, events = [], []
    for key in range(n):
        if live and rng.random() < 0.45:
            events.append((live.pop(rng.randrange(len(live))), -1))
        events.append((key, rng.choice(sizes)()))
        live.append(key)
    rng.shuffle(live)
    events += [(k, -1) for k in live[: len(live) * 3 // 4]]
    return events


def _check_books(m: CachingAllocatorModel) -> None:
    """Each segment's blocks tile it, no two free neighbours, the free lists hold exactly the
    free blocks, and the totals are the blocks'."""
    free_seen = set()
    live_bytes = pinned = 0
    for seg, first in m._first.items():
        b, end, any_live = first, 0, False
        assert b.prev is None and b.offset == 0
        while b is not None:
            assert b.offset == end and b.seg == seg and b.size > 0
            end += b.size
            if b.free:
                assert b.next is None or not b.next.free
                free_seen.add((b.seg, b.offset, b.size))
            else:
                live_bytes += b.size
                any_live = True
            assert b.next is None or b.next.prev is b
            b = b.next
        assert end == m._seg_size[seg]
        pinned += m._seg_size[seg] if any_live else 0
    listed = {(b.seg, b.offset, b.size) for b in m._by_order.values()}
    assert listed == free_seen
    assert sorted(m._free[True] + m._free[False]) == sorted(m._by_order)
    assert (m.allocated, m.pinned) == (live_bytes, pinned)


@pytest.mark.parametrize("rules", [CUDA, MPS], ids=lambda r: r.name)
@pytest.mark.parametrize("seed", range(4))
def test_replay_equals_the_plain_rules(rules, seed):
    events = _stream(seed)
    plain = Plain(rules)
    model = CachingAllocatorModel(None, rules)
    for i, (key, nbytes) in enumerate(events):
        if nbytes > 0:
            plain.malloc(key, nbytes)
            model.malloc(key, nbytes)
        else:
            plain.free(key)
            model.free(key)
        if i % 97 == 0:
            _check_books(model)
    _check_books(model)
    got = replay(events, rules)
    assert got == (model.peak_allocated, model.peak_reserved, model.peak_pinned)
    assert list(got) == plain.peaks


@pytest.mark.parametrize("rules", [CUDA, MPS], ids=lambda r: r.name)
@pytest.mark.parametrize("seed", range(3))
def test_replay_within_a_limit_equals_the_plain_rules(rules, seed):
    events = _stream(100 + seed, 800)
    unlimited = replay(events, rules)
    for limit in (unlimited[1], (unlimited[0] + unlimited[1]) // 2, unlimited[0] * 3 // 4):
        plain = Plain(rules, limit)
        for key, nbytes in events:
            plain.malloc(key, nbytes) if nbytes > 0 else plain.free(key)
        assert replay_within(events, limit, rules) == (plain.peaks[1], plain.oom)
