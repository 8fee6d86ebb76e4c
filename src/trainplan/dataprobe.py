"""Input pipeline: how many samples per second one DataLoader worker delivers, measured on the
user's own loader.

The step-time model (`timing.input_wait_s`) needs `samples_per_s_per_worker`, the rate at which
ONE worker process fetches, decodes, augments and collates samples. A DataLoader with w workers
runs w such processes in parallel, so it delivers about w x that rate, capped by the host's CPU
cores. We measure the single-process rate directly: the user's dataset, batch sampler and
collate function are iterated in this process (`num_workers=0`), which is exactly the work one
worker does per batch, minus the inter-process transfer of the finished batch (shared memory,
small next to decoding).

    rate = samples / seconds, over the batches after `warmup` batches (file caches, lazy
           imports and first-batch set-up are not steady state)

`--workers N` also runs the loader with N worker processes and reports the aggregate rate and
the scaling efficiency rate_N / (N x rate_1); below ~0.8 the workers contend for something
(disk, a lock, the GIL in a thread-based reader, fewer cores than N).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TrainplanError

DEFAULT_BATCH_SIZE = 32


@dataclass
class ProbeResult:
    """What `probe` measured. Rates in samples/s; times in seconds."""

    loader: str
    batch_size: int | None
    batches: int                          # measured batches (after warm-up)
    samples: int                          # samples in the measured batches
    seconds: float                        # wall time of the measured batches
    warmup_s: float                       # wall time of the warm-up batches
    samples_per_s_per_worker: float
    workers: int | None = None            # the multi-worker run, if asked for
    samples_per_s_with_workers: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def scaling_efficiency(self) -> float | None:
        """rate with N workers / (N x rate of one)."""
        if not self.workers or self.samples_per_s_with_workers is None:
            return None
        return self.samples_per_s_with_workers / (self.workers * self.samples_per_s_per_worker)

    def to_json(self) -> dict:
        return {"loader": self.loader, "batch_size": self.batch_size, "batches": self.batches,
                "samples": self.samples, "seconds": self.seconds, "warmup_s": self.warmup_s,
                "samples_per_s_per_worker": self.samples_per_s_per_worker,
                "workers": self.workers,
                "samples_per_s_with_workers": self.samples_per_s_with_workers,
                "scaling_efficiency": self.scaling_efficiency, "notes": list(self.notes)}


def load_loader(ref: str, base_dir: Path | None = None):
    """`py:<module or file.py>:<factory>` (the `py:` is optional) -> what the factory returns."""
    from .models.custom import _load_factory
    spec = ref[3:] if ref.startswith("py:") else ref
    if spec.count(":") < 1:
        raise TrainplanError(f"--loader {ref!r} must name a factory: "
                             "py:<module or file.py>:<factory>.",
                             fix="for example --loader py:train.py:make_loader (a function "
                                 "returning a DataLoader or Dataset)")
    factory = _load_factory(spec, base_dir)
    try:
        return factory()
    except TypeError as e:
        raise TrainplanError(f"{ref} could not be called without arguments: {e}",
                             fix="give a factory that takes no arguments and returns a DataLoader "
                                 "or Dataset") from None


def single_process_loader(obj, batch_size: int | None = None, num_workers: int = 0):
    """A DataLoader doing one worker's job: the object's dataset, sampler and collate, in-process.

    DataLoader -> rebuilt with `num_workers`; Dataset (map-style or iterable) -> wrapped with
    `batch_size` (default 32); any other iterable -> iterated as is (already a batch stream).
    """
    import torch.utils.data as tud
    if isinstance(obj, tud.DataLoader):
        kw = dict(collate_fn=obj.collate_fn, num_workers=num_workers,
                  worker_init_fn=obj.worker_init_fn)
        if isinstance(obj.dataset, tud.IterableDataset):
            return tud.DataLoader(obj.dataset, batch_size=batch_size or obj.batch_size,
                                  drop_last=obj.drop_last, **kw)
        if batch_size:
            return tud.DataLoader(obj.dataset, batch_size=batch_size, sampler=obj.sampler,
                                  drop_last=obj.drop_last, **kw)
        return tud.DataLoader(obj.dataset, batch_sampler=obj.batch_sampler, **kw)
    if isinstance(obj, tud.Dataset):
        return tud.DataLoader(obj, batch_size=batch_size or DEFAULT_BATCH_SIZE,
                              num_workers=num_workers, shuffle=False)
    if hasattr(obj, "__iter__"):
        if num_workers:
            raise TrainplanError("--workers needs a DataLoader or Dataset, not a plain iterable.")
        return obj
    raise TrainplanError(f"The loader factory returned {type(obj).__name__}, which cannot be "
                         "iterated.",
                         fix="return a torch.utils.data.DataLoader or Dataset")


def _leading_dim(x) -> int | None:
    """Leading dimension of the first tensor (or array) in a batch structure, else None."""
    if hasattr(x, "shape") and len(getattr(x, "shape", ())) > 0:
        return int(x.shape[0])
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ()
    for v in items:
        n = _leading_dim(v)
        if n is not None:
            return n
    return None


def batch_samples(batch) -> int:
    """Samples in one batch: the leading dimension of its first tensor; a list of plain items
    counts its items; anything else is one sample."""
    n = _leading_dim(batch)
    if n is not None:
        return n
    return len(batch) if isinstance(batch, (list, tuple)) else 1


def time_batches(iterable, warmup: int, max_batches: int,
                 max_s: float) -> tuple[int, int, float, float]:
    """(batches, samples, seconds, warm-up seconds) over up to `max_batches` after `warmup`."""
    it = iter(iterable)
    t0 = time.perf_counter()
    for _ in range(warmup):
        try:
            next(it)
        except StopIteration:
            break
    t1 = time.perf_counter()
    batches = samples = 0
    while batches < max_batches:
        try:
            b = next(it)
        except StopIteration:
            break
        batches += 1
        samples += batch_samples(b)
        if time.perf_counter() - t1 >= max_s:
            break
    return batches, samples, time.perf_counter() - t1, t1 - t0


def probe(obj, label: str = "loader", batch_size: int | None = None, warmup: int = 2,
          max_batches: int = 200, max_s: float = 10.0, workers: int | None = None) -> ProbeResult:
    """Measure samples/s of one worker on `obj` (DataLoader, Dataset or iterable of batches)."""
    loader = single_process_loader(obj, batch_size)
    batches, samples, secs, warm = time_batches(loader, warmup, max_batches, max_s)
    notes = []
    if batches == 0 or samples == 0 or secs <= 0:
        raise TrainplanError(f"{label} yielded no batches after {warmup} warm-up batch(es).",
                             fix="use a larger dataset, or --warmup 0")
    if batches < 5:
        notes.append(f"only {batches} batch(es) measured: the rate is rough")
    bs = batch_size or getattr(loader, "batch_size", None) or getattr(obj, "batch_size", None)
    res = ProbeResult(label, bs, batches, samples, secs, warm, samples / secs, notes=notes)
    if workers:
        multi = single_process_loader(obj, batch_size, num_workers=workers)
        # each worker's first batch carries its process start-up: warm up one batch per worker
        b, s, t, _ = time_batches(multi, max(warmup, workers), max_batches, max_s)
        if b and t > 0:
            res.workers, res.samples_per_s_with_workers = workers, s / t
    return res
