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


class _Block:
    """A block of a segment: [offset, offset + size), free or live, with its neighbours in the
    segment (the allocator's own doubly linked list: merging needs no search)."""

    __slots__ = ("seg", "offset", "size", "free", "prev", "next")

    def __init__(self, seg: int, offset: int, size: int, prev=None, next=None):
        self.seg, self.offset, self.size, self.free = seg, offset, size, True
        self.prev, self.next = prev, next


def _segment_size(n: int, rules: Rules = CUDA) -> int:
    if n <= rules.small_size:
        return rules.small_segment
    if n < rules.min_large_alloc:
        return rules.large_segment
    if rules.xlarge_segment and n < rules.xlarge_segment // 2:
        return rules.xlarge_segment
    return (n + rules.round_large - 1) // rules.round_large * rules.round_large


# A free block's place in its pool's best-fit order, (size, segment, offset), as one integer,
# size << _SIZE | segment << _SEG | offset (one comparison in C where a tuple's is three):
# offsets below 2**48 bytes, segments below 2**32, the order the same.
_SEG, _SIZE = 48, 80


class CachingAllocatorModel:
    def __init__(self, limit_bytes: int | None = None, rules: Rules = CUDA):
        self.rules = rules
        self.limit_bytes = limit_bytes          # segments may not exceed this (device free memory)
        self.oom = False                        # a request failed even after releasing the cache
        self._seg_size: list[int] = []          # seg -> its size (0 once released)
        self.reserved = 0
        self.peak_reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self._free = {True: [], False: []}      # small? -> sorted orders of its free blocks
        self._by_order: dict[int, _Block] = {}  # order -> free block
        self._first: dict[int, _Block] = {}     # seg -> its block at offset 0
        self._live: dict[int, _Block] = {}
        self._seg_small: list[bool] = []        # seg -> in the small pool?
        self._seg_live: list[int] = []          # seg -> live blocks in it
        self.pinned = 0                         # bytes of segments holding a live block
        self.peak_pinned = 0

    def _add_free(self, b: _Block, small: bool) -> None:
        order = (b.size << _SIZE) | (b.seg << _SEG) | b.offset
        bisect.insort(self._free[small], order)
        self._by_order[order] = b

    def _remove_free(self, b: _Block, small: bool) -> None:
        order = (b.size << _SIZE) | (b.seg << _SEG) | b.offset
        lst = self._free[small]
        i = bisect.bisect_left(lst, order)
        if i < len(lst) and lst[i] == order:
            lst.pop(i)
            del self._by_order[order]

    def malloc(self, key: int, nbytes: int) -> None:
        rules = self.rules
        b = rules.min_block
        size = max(b, (nbytes + b - 1) // b * b)       # rounded up to the block unit
        small = size <= rules.small_size
        lst = self._free[small]
        i = bisect.bisect_left(lst, size << _SIZE)
        if i < len(lst):
            block = self._by_order.pop(lst.pop(i))
        else:
            seg_size = _segment_size(size, rules)
            if self.limit_bytes is not None and self.reserved + seg_size > self.limit_bytes:
                self._release_cached_segments()
                if self.reserved + seg_size > self.limit_bytes:
                    self.oom = True
            seg = len(self._seg_size)
            self._seg_size.append(seg_size)
            self._seg_small.append(small)
            self._seg_live.append(0)
            self.reserved += seg_size
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
            block = self._first[seg] = _Block(seg, 0, seg_size)
        remaining = block.size - size
        if remaining >= b if small else remaining > rules.split_large:
            rest = _Block(block.seg, block.offset + size, remaining, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            self._add_free(rest, small)
            block.size = size
        block.free = False
        self._live[key] = block
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        seg_live, seg = self._seg_live, block.seg
        if seg_live[seg] == 0:
            self.pinned += self._seg_size[seg]
            if self.pinned > self.peak_pinned:
                self.peak_pinned = self.pinned
        seg_live[seg] += 1

    def _release_cached_segments(self) -> None:
        """cudaFree every segment that is one free block (holds no live tensor)."""
        for seg, block in list(self._first.items()):
            if block.next is not None or not block.free or block.size != self._seg_size[seg]:
                continue
            self._remove_free(block, self._seg_small[seg])
            del self._first[seg]
            self.reserved -= self._seg_size[seg]
            self._seg_size[seg] = 0

    def free(self, key: int) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        seg = block.seg
        self._seg_live[seg] -= 1
        if self._seg_live[seg] == 0:
            self.pinned -= self._seg_size[seg]
        small = self._seg_small[seg]
        block.free = True
        nxt = block.next                 # merge with the next block
        if nxt is not None and nxt.free:
            self._remove_free(nxt, small)
            _absorb(block, nxt)
        prev = block.prev                # merge with the previous block
        if prev is not None and prev.free:
            self._remove_free(prev, small)
            _absorb(prev, block)
            block = prev
        self._add_free(block, small)


def _absorb(left: _Block, right: _Block) -> None:
    """`right`, the block after `left` in its segment, merged into `left` and unlinked."""
    left.size += right.size
    left.next = right.next
    if right.next is not None:
        right.next.prev = left


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
