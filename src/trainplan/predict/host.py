"""The host side of an eager step: what the CPU spends issuing each kernel, and the queue
between it and the device.

Eager PyTorch issues every kernel from one CPU thread; a CUDA launch only queues the kernel on
the device's stream, which runs it once the kernels before it are done. So the device runs
behind the host, and a step is host-bound only where the queue runs dry. With h_i the host time
to issue kernel i (its own dispatch and the kernel-less ops before it: views, `host_ops` in the
trace) and d_i its device time, kernel i is issued at H_i = h_1 + ... + h_i and ends at
E_i = max(H_i, E_{i-1}) + d_i. Unrolled (a max-plus recurrence):

    E_n = D_n + max(0, max_i (H_i - D_{i-1})),   D_i = d_1 + ... + d_i

the device's own time plus the longest stretch by which the host ran behind it. A
synchronisation (a `.item()`, a data-dependent shape such as `nonzero`, GradScaler's inf check
before the optimizer step, the step's end) drains the queue: the host waits for the device, and
the recurrence starts again from there. The same kernels repeated k times (gradient
accumulation) have, in closed form, E = k D + m + max(0, (k - 1)(H - D)) with m the first
repetition's max term: the host's lag grows each time only when the host is the slower.

What a kernel costs the host depends on who issues it: a forward op under autograd (Python
module code, the autograd graph recorded), a backward op (issued by autograd's C++ engine), a
checkpointed block's op rerun in the backward (the block's forward again, a forward op's
dispatch, and torch.utils.checkpoint's own work: a hook on every tensor the block saved, the
rerun's bookkeeping and its check of what it recomputed, `checkpoint_s` a rerun op, measured
through a real checkpointed decoder, scripts/host_paths.py; the forward's share of that work is
counted here too, as the rerun repeats the forward's ops one for one), a no-grad forward as in
generation, an optimizer step's multi-tensor op (a Python call, as a forward op); each view or
other kernel-less op before it costs a view's dispatch, except in the backward, where a view is an
autograd node's op like any other and costs a backward op's (`backward_view_s`: host_dispatch.py
measures the backward per op, views among them). Between kernels the host also runs the model's
own Python: every module entered runs its forward (attribute reads, shape arithmetic, config
checks), `module_s` a module (the trace's `host_modules`), measured through real models' code
(scripts/host_paths.py --modules: BERT's transformers code enters 0.6 modules a CPU kernel,
Llama's 0.4, so BERT's host costs 1.5x Llama's a kernel where the dispatch alone says 1.1x). The
bundled fit leaves `module_s` and `backward_view_s` unset (docs/validation.md, "The model's own
code on the host": in the fit they help, on sources left out they did not). Per kind,

    h_kind = host_scale x dispatch_kind + cuda_launch_s      (a view: host_scale x dispatch_view;
                                                  a module: module_s, Python, no launch in it;
                                                  a rerun op: h_forward + checkpoint_s)

`dispatch_kind` is PyTorch's own dispatch cost by path, measured on a CPU with tensors too small
to cost anything (scripts/host_dispatch.py; efficiency.json `host_dispatch`): what separates the
paths is PyTorch's, not the GPU's. `cuda_launch_s` is the CPU time of a kernel launch beyond
the dispatch (CUDA's `cudaLaunchKernel`); no published figure names its host CPU, so it is 0
and `host_scale` carries it: one fitted number (scripts/calibrate_time.py), how much slower
the GPU machines of the fit issue an op than that CPU dispatched it (the launch, CUDA's device
guards, streams and the caching allocator on every op, and the host's own speed). A platform's host CPU scales all of it (`speed`: data/host_cpus.csv, relative to the
hosts the fit's runs used).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .optable import FORWARD, OPTIMIZER, OpTable
from .time_params import TimeParams

# kernels whose output size depends on the data: the host reads it back before it can go on
SYNC_OPS = frozenset({"nonzero", "masked_select", "_unique2", "unique_consecutive",
                      "unique_dim", "_local_scalar_dense"})


@dataclass(frozen=True)
class Queue:
    """One pass of a kernel sequence through the host/device queue (module docstring)."""

    device_s: float          # D: the kernels' device time
    host_s: float            # H: the host's time to issue them
    lag_s: float             # max(0, max_i (H_i - D_{i-1})): how far the host ran behind
    syncs: int = 0

    @property
    def seconds(self) -> float:
        return self.device_s + self.lag_s

    def repeated(self, k: int) -> float:
        """k passes back to back with no synchronisation between them (closed form)."""
        k = max(1, int(k))
        return k * self.device_s + self.lag_s + max(0.0, (k - 1) * (self.host_s - self.device_s))


def run_queue(host: np.ndarray, device: np.ndarray, sync: np.ndarray | None = None) -> Queue:
    """The queue over kernels with host times `host` and device times `device`, in issue order;
    `sync`: kernels after which the host waits for the device."""
    if not len(device):
        return Queue(0.0, 0.0, 0.0)
    if sync is None or not sync.any():
        return _segment(host, device)
    cuts = np.flatnonzero(sync) + 1
    dev = hst = lag = 0.0
    for part in np.split(np.arange(len(device)), cuts):
        if not len(part):
            continue
        q = _segment(host[part], device[part])
        dev, hst, lag = dev + q.device_s, hst + q.host_s, lag + q.lag_s
    return Queue(dev, hst, lag, int(sync.sum()))


def _segment(host: np.ndarray, device: np.ndarray) -> Queue:
    d_cum = np.cumsum(device)
    h_cum = np.cumsum(host)
    before = d_cum - device                  # D_{i-1}
    lag = max(0.0, float(np.max(h_cum - before)))
    return Queue(float(d_cum[-1]), float(h_cum[-1]), lag)


def host_costs(p: TimeParams) -> dict[str, float]:
    """Seconds the reference host spends issuing one op of each kind (module docstring)."""
    d, scale, launch = p.host_dispatch, p.host_scale, p.cuda_launch_s
    rerun = scale * d.backward_op_s if d.checkpoint_s is None else \
        scale * d.forward_op_s + d.checkpoint_s
    view = scale * d.view_s
    return {"forward": scale * d.forward_op_s + launch,
            "backward": scale * d.backward_op_s + launch,
            "recompute": rerun + launch,
            "inference": scale * d.inference_op_s + launch,
            "view": view,
            "backward_view": view if d.backward_view_s is None else scale * d.backward_view_s,
            "module": d.module_s or 0.0}


def _kinds(table: OpTable) -> np.ndarray:
    """(7, len(table.seq)): what each kernel's issue time is made of, a column a kernel: 1 in
    the row of who issues it (a forward, backward, optimizer or rerun op), then the views before
    it outside and within the backward and the modules entered before it. Its host time is
    `_weights` . its column (module docstring)."""
    ph = table.phase[table.seq]
    rerun = table.recompute[table.seq]
    backward = (ph != FORWARD) & (ph != OPTIMIZER) & ~rerun
    return np.stack([ph == FORWARD, backward, ph == OPTIMIZER, rerun, table.seq_host * ~backward,
                     table.seq_host * backward, table.seq_modules]).astype(float)


def _weights(p: TimeParams, speed: float = 1.0, processes: int = 1,
             inference: bool = False) -> np.ndarray:
    """The host's seconds for each row of `_kinds` (an optimizer op is a Python call, as a forward
    op), on a host of `speed` issuing for `processes` devices (`issue_times`)."""
    c = host_costs(p)
    w = np.array([c["inference" if inference else "forward"], c["backward"], c["forward"],
                  c["recompute"], c["view"], c["backward_view"], c["module"]])
    return w * (max(1, processes) / max(speed, 1e-9))


def issue_times(table: OpTable, p: TimeParams, speed: float = 1.0, inference: bool = False,
                processes: int = 1) -> np.ndarray:
    """Host seconds to issue each kernel of `table.seq` (module docstring). `processes` > 1:
    torch.nn.DataParallel issues every device's kernels from one Python thread."""
    return _weights(p, speed, processes, inference) @ _kinds(table)


def sync_mask(table: OpTable) -> np.ndarray:
    """True for the kernels of `table.seq` the host waits on (SYNC_OPS); memoised."""
    memo = table.memo.sync
    if memo is None:
        unique = np.fromiter((n in SYNC_OPS for n in table.name), dtype=bool,
                             count=len(table.name))
        memo = table.memo.sync = unique[table.seq]
    return memo


@dataclass(frozen=True)
class StepQueue:
    """A training step through the queue: k micro-batches, then the optimizer step."""

    micro_batch: Queue       # forward + backward of one micro-batch
    forward: Queue           # forward alone (a reference model's pass)
    optimizer: Queue
    seconds: float           # the whole step, k micro-batches and the optimizer
    device_s: float
    exposed_host_s: float    # seconds the device waited on the host


@dataclass
class _Issue:
    """What the queue reads off a table's order that no parameter changes (memoised on it):
    the phases' extents in `seq` (forward, backward, optimizer follow each other) and, within the
    micro-batch (forward + backward) and the optimizer, the running counts of each kind of host
    work, so the host's issue times are a weighted sum of them, not a new cumulative sum."""

    n_fwd: int
    n_mb: int
    counts: np.ndarray       # (7, len(seq)): `_kinds`' rows, so far
    sync: bool


def _issue(table: OpTable) -> _Issue:
    memo = table.memo.issue
    if memo is not None:
        return memo
    ph = table.phase[table.seq]
    n_fwd, n_mb = int((ph == FORWARD).sum()), int((ph != OPTIMIZER).sum())
    if not (np.all(ph[:n_fwd] == FORWARD) and np.all(ph[n_fwd:n_mb] != OPTIMIZER)):
        raise ValueError("the op table's order is not forward, backward, optimizer")
    kinds = _kinds(table)
    counts = np.concatenate([np.cumsum(kinds[:, :n_mb], axis=1),
                             np.cumsum(kinds[:, n_mb:], axis=1)], axis=1)
    memo = table.memo.issue = _Issue(n_fwd, n_mb, counts, bool(sync_mask(table).any()))
    return memo


def step_queue(table: OpTable, device: np.ndarray, p: TimeParams, k: int = 1, speed: float = 1.0,
               processes: int = 1, sync_before_optimizer: bool = False) -> StepQueue:
    """Run a training step's kernels through the queue: `device` is each unique op's device
    time (timing.op_times); k micro-batches back to back, then the optimizer step, which
    starts after a synchronisation where `sync_before_optimizer` (GradScaler's inf check)."""
    iss = _issue(table)
    dev = device[table.seq]
    if iss.sync:                 # a kernel the host waits on: the general queue, segment-wise
        host = issue_times(table, p, speed, processes=processes)
        sync = sync_mask(table)
        mb, fw, op = slice(0, iss.n_mb), slice(0, iss.n_fwd), slice(iss.n_mb, None)
        q_mb = run_queue(host[mb], dev[mb], sync[mb])
        q_fw = run_queue(host[fw], dev[fw], sync[fw])
        q_opt = run_queue(host[op], dev[op], sync[op])
    else:
        h_cum = _weights(p, speed, processes) @ iss.counts
        q_fw, q_mb, q_opt = _prefixes(h_cum, dev, iss.n_fwd, iss.n_mb)
    k = max(1, int(k))
    t_mb = k * q_mb.seconds if q_mb.syncs else q_mb.repeated(k)
    if sync_before_optimizer or q_mb.syncs:
        total = t_mb + q_opt.seconds
    else:
        # the optimizer's kernels follow in the same queue: the host issues them once it has
        # issued the last micro-batch's, the device runs them once it has run that
        host_done = k * q_mb.host_s
        total = max(t_mb, host_done + q_opt.lag_s) + q_opt.device_s
    device_total = k * q_mb.device_s + q_opt.device_s
    return StepQueue(q_mb, q_fw, q_opt, total, device_total, max(0.0, total - device_total))


def _prefixes(h_cum: np.ndarray, dev: np.ndarray, n_fwd: int, n_mb: int
              ) -> tuple[Queue, Queue, Queue]:
    """The forward, the micro-batch (forward + backward) and the optimizer through the queue,
    from the host's running issue times (each part's own, restarting at the optimizer) and the
    kernels' device times in order: one running sum of the device times serves all three (the
    forward is the micro-batch's first part)."""
    out = []
    for lo, hi in ((0, n_mb), (n_mb, len(dev))):
        if hi <= lo:
            out.append((Queue(0.0, 0.0, 0.0), Queue(0.0, 0.0, 0.0)))
            continue
        d = dev[lo:hi]
        d_cum = np.cumsum(d)
        gap = h_cum[lo:hi] - (d_cum - d)
        whole = Queue(float(d_cum[-1]), float(h_cum[hi - 1]), max(0.0, float(gap.max())))
        n = n_fwd if lo == 0 else 0
        first = Queue(float(d_cum[n - 1]), float(h_cum[n - 1]), max(0.0, float(gap[:n].max()))) \
            if n else Queue(0.0, 0.0, 0.0)
        out.append((whole, first))
    (mb, fw), (opt, _) = out
    return fw, mb, opt
