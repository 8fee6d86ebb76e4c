"""Replay a traced step's allocations through a model of PyTorch's CUDA caching allocator.

`torch.cuda.max_memory_reserved()` exceeds `max_memory_allocated()` because the caching allocator
(c10/cuda/CUDACachingAllocator.cpp) never returns memory to the driver during training and cannot
always reuse what it holds. Its rules, as modelled here:

* sizes round up to 512 bytes (kRoundLarge/kMinBlockSize);
* requests <= 1 MiB come from the small pool, carved out of 2 MiB segments (kSmallBuffer);
* larger requests come from the large pool: requests < 10 MiB (kMinLargeAlloc) get a 20 MiB
  segment (kLargeBuffer), bigger ones a segment rounded up to 2 MiB (kRoundLarge);
* a request takes the smallest free block of its pool that is large enough (best fit) and splits
  it when the remainder is worth keeping (small pool: >= 512 B; large pool: > 1 MiB);
* a freed block merges with free neighbours of the same segment; segments are never released...
* ...except when the device is full: if a new segment would not fit, the allocator frees every
  cached segment that holds no live block (`release_cached_blocks`, as `torch.cuda.empty_cache()`
  does) and retries the cudaMalloc once before raising out-of-memory
  (CUDACachingAllocator.cpp, `malloc`: alloc_block -> release_available_cached_blocks ->
  release_cached_blocks -> alloc_block). So a job whose unconstrained peak reserved exceeds the
  device can still run, with the fragmentation it can give back returned on demand.

Peak reserved = the largest total segment size during the replay. Peak pinned = the largest total
size of segments that hold at least one live block: what the allocator cannot give back even when
it releases its whole cache, so the least device memory the step runs in (within 1% of bisecting
the limit with `replay_within` on the traces we checked: Stable LM 2 1.6B, micro-batch 1-33).
`replay_within(events, limit)` replays with a device limit and says whether the retry path would
still run out of memory.

The same replay serves each backend with its own constants (`Rules`, `rules_for`): ROCm runs the
CUDA allocator itself (PyTorch hipifies CUDACachingAllocator.cpp, so HIP's caching allocator has
the same rounding and segment sizes); Apple's MPS allocator (aten/src/ATen/mps/MPSAllocator.h,
data/SOURCES.md S111) is "based on CUDACachingAllocator" with Metal heaps in place of segments:
requests <= 1 MiB share 8 MiB heaps, < 10 MiB 32 MiB heaps, < 512 MiB 1 GiB heaps on a
unified-memory device, larger ones get a heap of their own rounded to 2 MiB; it too frees its
cached heaps and retries before failing. Buffers are taken as rounded to Apple silicon's 16 KiB
VM page (the heap's alignment is whatever Metal's `heapBufferSizeAndAlign` answers; assumed).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

KB, MB = 1024, 1024 * 1024
SMALL_SIZE = 1 * MB
SMALL_BUFFER = 2 * MB
LARGE_BUFFER = 20 * MB
MIN_LARGE_ALLOC = 10 * MB
ROUND_LARGE = 2 * MB
MIN_BLOCK = 512


@dataclass(frozen=True)
class Rules:
    """One backend's allocator constants (module docstring)."""

    name: str
    min_block: int = MIN_BLOCK            # every size rounds up to this
    small_size: int = SMALL_SIZE          # requests up to this come from the small pool
    small_segment: int = SMALL_BUFFER     # what a small request's new segment/heap is
    large_segment: int = LARGE_BUFFER     # ... a request under min_large_alloc's
    min_large_alloc: int = MIN_LARGE_ALLOC
    round_large: int = ROUND_LARGE        # a bigger request's own segment rounds to this
    xlarge_segment: int = 0               # MPS: requests under half of it share a heap this size
    split_large: int = SMALL_SIZE         # a large-pool block splits when more than this is left
    expandable: bool = False              # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True


CUDA = Rules("cuda")          # and ROCm: the same allocator, hipified
CUDA_EXPANDABLE = Rules("cuda-expandable", expandable=True)   # expandable.py
MPS = Rules("mps", min_block=16 * KB, small_segment=8 * MB, large_segment=32 * MB,
            xlarge_segment=1024 * MB, split_large=16 * KB)


def rules_for(backend: str, expandable: bool = False) -> Rules:
    """The allocator model of a catalog backend (cuda, rocm, mps, xla); `expandable`: the job
    sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which CUDA's allocator honours
    (expandable.py; ROCm's build of PyTorch compiles expandable segments out, MPS has none)."""
    if backend == "mps":
        return MPS
    return CUDA_EXPANDABLE if expandable and backend == "cuda" else CUDA


def _model(limit_bytes: int | None, rules: Rules):
    if rules.expandable:
        from .expandable import ExpandableAllocatorModel
        return ExpandableAllocatorModel(limit_bytes)
    return CachingAllocatorModel(limit_bytes, rules)


@dataclass
class _Block:
    seg: int
    offset: int
    size: int
    free: bool = True


def _round(n: int, rules: Rules = CUDA) -> int:
    b = rules.min_block
    return max(b, (n + b - 1) // b * b)


def _segment_size(n: int, rules: Rules = CUDA) -> int:
    if n <= rules.small_size:
        return rules.small_segment
    if n < rules.min_large_alloc:
        return rules.large_segment
    if rules.xlarge_segment and n < rules.xlarge_segment // 2:
        return rules.xlarge_segment
    return (n + rules.round_large - 1) // rules.round_large * rules.round_large


class CachingAllocatorModel:
    def __init__(self, limit_bytes: int | None = None, rules: Rules = CUDA):
        self.rules = rules
        self.limit_bytes = limit_bytes          # segments may not exceed this (device free memory)
        self.oom = False                        # a request failed even after releasing the cache
        self._seg_size: dict[int, int] = {}
        self.reserved = 0
        self.peak_reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self._free = {True: [], False: []}      # small? -> sorted [(size, seg, offset)]
        self._blocks: dict[tuple[int, int], _Block] = {}   # (seg, offset) -> block
        self._seg_blocks: dict[int, list[int]] = {}        # seg -> sorted offsets
        self._live: dict[int, _Block] = {}
        self._nseg = 0
        self._seg_small: dict[int, bool] = {}
        self._seg_live: dict[int, int] = {}     # seg -> live blocks in it
        self.pinned = 0                         # bytes of segments holding a live block
        self.peak_pinned = 0

    def _add_free(self, b: _Block, small: bool) -> None:
        bisect.insort(self._free[small], (b.size, b.seg, b.offset))

    def _remove_free(self, b: _Block, small: bool) -> None:
        lst = self._free[small]
        i = bisect.bisect_left(lst, (b.size, b.seg, b.offset))
        if i < len(lst) and lst[i] == (b.size, b.seg, b.offset):
            lst.pop(i)

    def malloc(self, key: int, nbytes: int) -> None:
        rules = self.rules
        size = _round(nbytes, rules)
        small = size <= rules.small_size
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size, -1, -1))
        if i < len(lst):
            _, seg, off = lst.pop(i)
            block = self._blocks[(seg, off)]
        else:
            seg_size = _segment_size(size, rules)
            if self.limit_bytes is not None and self.reserved + seg_size > self.limit_bytes:
                self._release_cached_segments()
                if self.reserved + seg_size > self.limit_bytes:
                    self.oom = True
            seg = self._nseg
            self._nseg += 1
            self._seg_size[seg] = seg_size
            self.reserved += seg_size
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
            block = _Block(seg, 0, seg_size)
            self._blocks[(seg, 0)] = block
            self._seg_blocks[seg] = [0]
            self._seg_small[seg] = small
        remaining = block.size - size
        if remaining >= rules.min_block if small else remaining > rules.split_large:
            rest = _Block(block.seg, block.offset + size, remaining)
            self._blocks[(rest.seg, rest.offset)] = rest
            bisect.insort(self._seg_blocks[rest.seg], rest.offset)
            self._add_free(rest, small)
            block.size = size
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        live = self._seg_live.get(block.seg, 0)
        if live == 0:
            self.pinned += self._seg_size[block.seg]
            if self.pinned > self.peak_pinned:
                self.peak_pinned = self.pinned
        self._seg_live[block.seg] = live + 1

    def _release_cached_segments(self) -> None:
        """cudaFree every segment that is one free block (holds no live tensor)."""
        for seg, offs in list(self._seg_blocks.items()):
            if offs != [0]:
                continue
            block = self._blocks[(seg, 0)]
            if not block.free or block.size != self._seg_size[seg]:
                continue
            self._remove_free(block, self._seg_small[seg])
            del self._blocks[(seg, 0)], self._seg_blocks[seg]
            self.reserved -= self._seg_size.pop(seg)

    def free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        self._seg_live[block.seg] -= 1
        if self._seg_live[block.seg] == 0:
            self.pinned -= self._seg_size[block.seg]
        small = self._seg_small[block.seg]
        block.free = True
        offs = self._seg_blocks[block.seg]
        i = bisect.bisect_left(offs, block.offset)
        # merge with the next block
        if i + 1 < len(offs):
            nxt = self._blocks[(block.seg, offs[i + 1])]
            if nxt.free:
                self._remove_free(nxt, small)
                block.size += nxt.size
                del self._blocks[(nxt.seg, nxt.offset)]
                offs.pop(i + 1)
        # merge with the previous block
        if i > 0:
            prev = self._blocks[(block.seg, offs[i - 1])]
            if prev.free:
                self._remove_free(prev, small)
                prev.size += block.size
                del self._blocks[(block.seg, block.offset)]
                offs.pop(i)
                block = prev
        self._add_free(block, small)


def replay(events: list[tuple[int, int]], rules: Rules = CUDA) -> tuple[int, int, int]:
    """(peak allocated, peak reserved, peak pinned) bytes for a traced alloc(+)/free(-) event
    stream. Pinned: segments that hold at least one live block, the part of the reserved memory
    the allocator could not give back at that moment."""
    model = _model(None, rules)
    malloc, free = model.malloc, model.free
    for key, nbytes in events:
        if nbytes > 0:
            malloc(key, nbytes)
        else:
            free(key)
    return model.peak_allocated, model.peak_reserved, model.peak_pinned


def replay_within(events: list[tuple[int, int]], limit_bytes: int,
                  rules: Rules = CUDA) -> tuple[int, bool]:
    """(peak reserved, out of memory?) replaying `events` on a device with `limit_bytes` free for
    the allocator, cached segments released and the request retried when a cudaMalloc would fail."""
    model = _model(limit_bytes, rules)
    for key, nbytes in events:
        if nbytes > 0:
            model.malloc(key, nbytes)
        else:
            model.free(key)
    return model.peak_reserved, model.oom
