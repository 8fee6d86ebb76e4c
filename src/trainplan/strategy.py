"""Strategy: how a job spreads over devices and what each device holds. One type, parsed once where
a job is read (spec.py); memory, timing, the fix ladder and the reports ask it.

    name    launcher                          each device holds (of N devices)
    single  python train.py                   everything
    dp      torch.nn.DataParallel (1 process) everything; GPU 0 also the gathered outputs
    ddp     torchrun, DistributedDataParallel everything + DDP's gradient buckets
    zero1   DeepSpeed ZeRO stage 1            optimizer state / N           (P_os)
    zero2   DeepSpeed ZeRO stage 2            optimizer state, gradients / N (P_os+g)
    zero3   DeepSpeed ZeRO stage 3            optimizer state, gradients, weights / N (P_os+g+p)
    fsdp    PyTorch FSDP (FULL_SHARD)         as zero3
    hsdp    PyTorch FSDP (HYBRID_SHARD)       as zero3 over the devices of its node (of N / nodes
                                              replicas, one a node); gradients all-reduced
                                              between the replicas

Stages from Rajbhandari et al. 2020 (ZeRO, arXiv:1910.02054, section 5); FSDP and its hybrid
sharding from Zhao et al. 2023 (arXiv:2304.11277, section 3.2.2: "sharding within a host,
replicating across hosts"). `order` ranks how much a strategy shards, for the fix ladder; on one
node hsdp is fsdp. `shard_devices` says over how many devices a strategy shards.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import unknown
from .named import Named


# GPUs a node: an 8-GPU server (HGX/DGX), what hybrid sharding shards over and beyond which
# predict/comm.py's collectives cross the network
DEVICES_PER_NODE = 8


@dataclass(frozen=True, eq=False)
class Strategy(Named):
    name: str
    label: str
    shards_optimizer: bool = False
    shards_gradients: bool = False
    shards_weights: bool = False
    distributed: bool = False      # one process per device (torchrun / deepspeed launchers)
    order: int = 0                 # how much is sharded: single/dp/ddp 0, zero1 1, zero2 2, zero3 3
    fsdp: bool = False             # PyTorch FSDP (its wrapping, offload and state dicts)
    hybrid: bool = False           # sharded within a node only, replicated across nodes

    @property
    def sharded(self) -> bool:
        """Shards something over the devices: needs more than one device (or CPU offload)."""
        return self.shards_optimizer

    def shard_devices(self, n: int, per_node: int = DEVICES_PER_NODE) -> int:
        """Devices one copy of the sharded state is split over, of `n` with `per_node` a node:
        all n, or under hybrid sharding the devices of one node."""
        return min(n, per_node) if self.hybrid else n

    def optimizer_shards(self, n: int) -> int:
        """The parts, of `n` devices, each device's optimizer state is 1 of (1: not sharded)."""
        return self.shard_devices(n) if self.shards_optimizer and n > 1 else 1

    def weight_shards(self, n: int) -> int:
        """The parts, of `n` devices, each device's weights are 1 of (1: not sharded)."""
        return self.shard_devices(n) if self.shards_weights and n > 1 else 1

    def reduces_each_micro_batch(self, sync_each_batch: bool) -> bool:
        """Whether, with gradient accumulation, each micro-batch's gradients are reduced over the
        devices as its backward runs (True), or only the last micro-batch's, the others
        accumulating locally (False). The one rule memory (predict/sharding.py) and communication
        (predict/comm.py) both read.

            dp              every backward (DataParallel reduces to GPU 0 each time)
            zero2, zero3    every micro-batch: DeepSpeed reduces each backward's gradients into
                            the partitions (stage_1_and_2.py reduce_ipg_grads, stage3.py);
                            accelerate and the HF Trainer never enter no_sync under DeepSpeed
            zero1           the last only: full gradients accumulate to the boundary
            ddp, fsdp,      the training loop's choice, `sync_each_batch`: accelerate's
            hsdp            accumulate() and the HF Trainer enter no_sync on every micro-batch
                            but the last unless GradientAccumulationPlugin(sync_each_batch=True)
                            (huggingface/accelerate@16cb6eb accelerator.py:1283-1297,
                            utils/dataclasses.py:1024; transformers trainer.py
                            _inner_training_loop, accelerator_config.gradient_accumulation_kwargs);
                            Composer never wraps an FSDP model in no_sync (composer/trainer/ddp.py
                            ddp_sync_context returns at once for a model that is not
                            DistributedDataParallel), nor does torchtune's distributed recipe
                            (recipes/full_finetune_distributed.py: loss.backward() on every
                            micro-batch, FSDP2 reduce-scatters each time)

        Under FSDP, no_sync keeps every unsharded gradient from the first micro-batch to the last
        (torch FSDP no_sync docstring: "accumulate the full model gradients (instead of gradient
        shards)"); syncing each micro-batch keeps only the shards and pays a reduce-scatter each.
        """
        if self.name == "dp" or self.order == 2 or (self.order == 3 and not self.fsdp):
            return True
        if self.order == 1:
            return False
        return bool(sync_each_batch)

    @property
    def loop_decides_sync(self) -> bool:
        """Whether the training loop's `sync_each_batch` changes when the gradients are reduced
        (DDP, FSDP, HSDP), rather than the strategy deciding alone (`reduces_each_micro_batch`)."""
        return self.reduces_each_micro_batch(True) != self.reduces_each_micro_batch(False)

    @property
    def replicated(self) -> bool:
        """Every device holds the whole model: single, dp, ddp."""
        return not self.shards_optimizer


SINGLE = Strategy("single", "one device")
DP = Strategy("dp", "DataParallel (one process, replicas on every GPU)")
DDP = Strategy("ddp", "DistributedDataParallel (torchrun, one process per device)", distributed=True)
ZERO1 = Strategy("zero1", "DeepSpeed ZeRO-1 (optimizer state sharded)", True, distributed=True,
                 order=1)
ZERO2 = Strategy("zero2", "DeepSpeed ZeRO-2 (optimizer state and gradients sharded)", True, True,
                 distributed=True, order=2)
ZERO3 = Strategy("zero3", "DeepSpeed ZeRO-3 (optimizer state, gradients and weights sharded)",
                 True, True, True, distributed=True, order=3)
FSDP = Strategy("fsdp", "PyTorch FSDP, full sharding (as ZeRO-3)", True, True, True,
                distributed=True, order=3, fsdp=True)
HSDP = Strategy("hsdp", "PyTorch FSDP, hybrid sharding (in each node, replicas across)", True,
                True, True, distributed=True, order=3, fsdp=True, hybrid=True)
ALL: tuple[Strategy, ...] = (SINGLE, DP, DDP, FSDP, HSDP, ZERO1, ZERO2, ZERO3)
NAMES = tuple(s.name for s in ALL)
_ALIASES = {"none": SINGLE, "no": SINGLE, "dataparallel": DP, "data-parallel": DP,
            "deepspeed-zero1": ZERO1, "deepspeed-zero2": ZERO2, "deepspeed-zero3": ZERO3,
            "zero-1": ZERO1, "zero-2": ZERO2, "zero-3": ZERO3, "fsdp1": FSDP, "full-shard": FSDP,
            "hybrid-shard": HSDP, "fsdp-hybrid": HSDP}


def parse(value, where: str = "--strategy") -> Strategy:
    """A spelling -> its Strategy; TrainplanError with the choices otherwise."""
    if isinstance(value, Strategy):
        return value
    text = str(value).strip().lower().replace("_", "-")
    for s in ALL:
        if s.name == text:
            return s
    if text in _ALIASES:
        return _ALIASES[text]
    raise unknown("strategy", text, NAMES, n=1, what=f"{where} {value!r} is not a strategy.",
                  allowed=", ".join(NAMES))
