"""PyTorch's CUDA caching allocator with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

With expandable segments (PyTorch >= 2.1; c10/cuda/CUDACachingAllocator.cpp, Note [Expandable
Segments]) the allocator does not cudaMalloc a segment per request: each pool (small: requests
<= 1 MiB; large) reserves one virtual address range and maps physical pages into it as it grows
(cuMemCreate/cuMemMap), 2 MiB pages for the small pool and 20 MiB pages (kLargeBuffer) for the
large one. What changes against the default allocator (allocator.py), rule by rule from that
source:

* every block lives in the one range, so a freed block merges with its free neighbours
  whatever request they came from (`free_block` -> `try_merge_blocks`; only blocks both mapped
  or both unmapped merge);
* any block splits when 512 bytes or more are left (`should_split`: "is_small ||
  expandable_segments() -> remaining >= kMinBlockSize"), in the large pool too;
* a request takes the smallest mapped free block that fits (best fit), except that a free block
  followed by unmapped space counts as the size it could grow to, so a larger block elsewhere is
  taken before the growing end (`get_free_block`, `expandable_size`);
* where no mapped free block fits, the lowest-addressed unmapped range is mapped, together with
  the free block just before it (`find_expandable_block`, `try_allocate_expandable_block`): the
  range grows by the request less that free block, rounded up to whole pages (`map_block`);
* reserved memory is the mapped pages; nothing is unmapped during training except when a page
  mapping would fail: then every page lying wholly inside a free block is unmapped
  (`release_cached_blocks` -> `release_blocks` -> `unmap_block`) and the request retried.

So peak reserved is the peak of mapped pages, and the least it runs in (peak pinned, as
allocator.py defines it) is the peak of mapped pages less the free blocks' whole pages: what
stays mapped after the release. The model replays one stream, as the tracer's log is one.
"""
from __future__ import annotations

import bisect

MB = 1024 * 1024
SMALL_SIZE = 1 * MB          # kSmallSize: larger requests go to the large pool
SMALL_PAGE = 2 * MB          # kSmallBuffer: the small pool's page
LARGE_PAGE = 20 * MB         # kLargeBuffer: the large pool's page
MIN_BLOCK = 512              # kMinBlockSize: sizes round up to it; a block splits above it
SPACE = 1 << 50              # the unmapped address space after the mapped part (1.125 x the
                             # device's memory in PyTorch; only "larger than any request" matters)

LIVE, FREE, UNMAPPED = 0, 1, 2


class _Range:
    """One pool's address range: blocks by start address, each [size, state]."""

    def __init__(self, page: int):
        self.page = page
        self.starts = [0]
        self.blocks = {0: [SPACE, UNMAPPED]}
        self.free: list[tuple[int, int]] = []     # (size, start) of mapped free blocks
        self.unmapped = [0]                       # starts of unmapped blocks, ascending
        self.mapped = 0
        self.releasable = 0    # whole pages inside mapped free blocks (unmapped on a release)

    # -- bookkeeping of one block's state ----------------------------------------------------
    def _whole_pages(self, start: int, size: int) -> int:
        p = self.page
        lo, hi = -(-start // p), (start + size) // p
        return max(0, hi - lo) * p

    def _set(self, start: int, size: int, state: int) -> None:
        """Add block [start, start + size) in `state` (its start not yet a block's)."""
        bisect.insort(self.starts, start)
        self.blocks[start] = [size, state]
        self._enter(start, size, state)

    def _enter(self, start: int, size: int, state: int) -> None:
        if state == FREE:
            bisect.insort(self.free, (size, start))
            self.releasable += self._whole_pages(start, size)
        elif state == UNMAPPED:
            bisect.insort(self.unmapped, start)

    def _leave(self, start: int) -> None:
        size, state = self.blocks[start]
        if state == FREE:
            self.free.pop(bisect.bisect_left(self.free, (size, start)))
            self.releasable -= self._whole_pages(start, size)
        elif state == UNMAPPED:
            self.unmapped.pop(bisect.bisect_left(self.unmapped, start))

    def _drop(self, start: int) -> None:
        self._leave(start)
        del self.blocks[start]
        self.starts.pop(bisect.bisect_left(self.starts, start))

    def _neighbours(self, start: int) -> tuple[int | None, int | None]:
        i = bisect.bisect_left(self.starts, start)
        prev = self.starts[i - 1] if i > 0 else None
        nxt = self.starts[i + 1] if i + 1 < len(self.starts) else None
        return prev, nxt

    def _merge(self, start: int) -> int:
        """Merge the block at `start` with its neighbours of the same mapped state (free with
        free, unmapped with unmapped); the merged block's start."""
        size, state = self.blocks[start]
        self._leave(start)
        prev, nxt = self._neighbours(start)
        if nxt is not None and self.blocks[nxt][1] == state:
            size += self.blocks[nxt][0]
            self._drop(nxt)
        if prev is not None and self.blocks[prev][1] == state:
            self._leave(prev)                 # the merged block starts at prev's start
            size += self.blocks[prev][0]
            del self.blocks[start]
            self.starts.pop(bisect.bisect_left(self.starts, start))
            start = prev
        self.blocks[start] = [size, state]
        self._enter(start, size, state)
        return start

    # -- the allocator's steps ---------------------------------------------------------------
    def best_fit(self, size: int) -> int | None:
        """`get_free_block`: the smallest mapped free block that fits, a block before unmapped
        space counted at what it could grow to."""
        i = bisect.bisect_left(self.free, (size, -1))
        if i == len(self.free):
            return None

        def grows_to(j: int) -> int:
            s, start = self.free[j]
            nxt = self._neighbours(start)[1]
            return s + (self.blocks[nxt][0] if nxt is not None and
                        self.blocks[nxt][1] == UNMAPPED else 0)

        while i + 1 < len(self.free) and grows_to(i + 1) < grows_to(i):
            i += 1
        return self.free[i][1]

    def grow(self, size: int) -> int:
        """`try_allocate_expandable_block`: map pages at the lowest unmapped range with room
        (taken with the free block before it) until a free block of `size` stands there; its
        start."""
        for u in self.unmapped:               # `find_expandable_block`
            prev = self._neighbours(u)[0]
            c = prev if prev is not None and self.blocks[prev][1] == FREE else u
            room, s = 0, c
            while room < size and s is not None and self.blocks[s][1] != LIVE:
                room += self.blocks[s][0]
                s = self._neighbours(s)[1]
            if room >= size:
                break
        if self.blocks[c][1] == UNMAPPED:
            c = self._map(c, min(self.blocks[c][0], size))
        while self.blocks[c][0] < size:       # free -> unmapped: map some of it, merged
            nxt = self._neighbours(c)[1]
            c = self._map(nxt, min(size - self.blocks[c][0], self.blocks[nxt][0]))
        return c

    def _map(self, start: int, nbytes: int) -> int:
        """`map_block`: map the pages covering `nbytes` from the unmapped block at `start` (a
        page boundary); the free block it becomes part of."""
        usize = self.blocks[start][0]
        take = min(usize, -(-nbytes // self.page) * self.page)
        self._drop(start)
        self._set(start, take, FREE)
        if take < usize:
            self._set(start + take, usize - take, UNMAPPED)
        self.mapped += take
        return self._merge(start)

    def take(self, start: int, size: int) -> None:
        """Hand out `size` bytes at the free block at `start`, splitting off the rest."""
        bsize, _state = self.blocks[start]
        self._leave(start)
        if bsize - size >= MIN_BLOCK:
            self.blocks[start] = [size, LIVE]
            self._set(start + size, bsize - size, FREE)
        else:
            self.blocks[start] = [bsize, LIVE]

    def give_back(self, start: int) -> int:
        """A live block freed (merged with free neighbours); its size."""
        size = self.blocks[start][0]
        self.blocks[start][1] = FREE
        self._enter(start, size, FREE)
        self._merge(start)
        return size

    def release(self) -> None:
        """`release_blocks`: unmap every page lying wholly inside a free block."""
        p = self.page
        for size, start in list(self.free):
            lo, hi = -(-start // p) * p, (start + size) // p * p
            if hi <= lo:
                continue
            self._leave(start)
            del self.blocks[start]
            self.starts.pop(bisect.bisect_left(self.starts, start))
            if lo > start:
                self._set(start, lo - start, FREE)
            if start + size > hi:
                self._set(hi, start + size - hi, FREE)
            self._set(lo, hi - lo, UNMAPPED)
            self.mapped -= hi - lo
            self._merge(lo)


class ExpandableAllocatorModel:
    """The caching allocator with expandable segments (module docstring); the same interface
    as allocator.py's `CachingAllocatorModel`."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self.oom = False
        self._pools = {True: _Range(SMALL_PAGE), False: _Range(LARGE_PAGE)}
        self._live: dict[int, tuple[bool, int, int]] = {}    # key -> (small?, start, size)
        self.allocated = self.peak_allocated = 0
        self.reserved = self.peak_reserved = 0
        self.peak_pinned = 0

    def _mapped(self) -> int:
        return sum(r.mapped for r in self._pools.values())

    def _mark(self) -> None:
        pools = self._pools.values()
        self.reserved = self._mapped()
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        pinned = self.reserved - sum(r.releasable for r in pools)
        self.peak_pinned = max(self.peak_pinned, pinned)

    def malloc(self, key: int, nbytes: int) -> None:
        size = max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        start = pool.best_fit(size)
        if start is None:
            start = pool.grow(size)
            if self.limit_bytes is not None and self._mapped() > self.limit_bytes:
                # the mapping fails: every free page is unmapped and the request retried
                for r in self._pools.values():
                    r.release()
                start = pool.best_fit(size)
                if start is None:
                    start = pool.grow(size)
                self.oom = self.oom or self._mapped() > self.limit_bytes
        pool.take(start, size)
        taken = pool.blocks[start][0]
        self._live[key] = (small, start, taken)
        self.allocated += taken
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._mark()

    def free(self, key: int) -> None:
        hit = self._live.pop(key, None)
        if hit is None:
            return
        small, start, size = hit
        self._pools[small].give_back(start)
        self.allocated -= size
        self._mark()
