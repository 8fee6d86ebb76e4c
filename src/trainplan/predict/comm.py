"""Communication of one optimizer step: what each strategy sends between devices, and what of it
the step's compute cannot hide.

Collectives (ring algorithm, S02): an all-reduce moves 2(n-1)/n x payload per device, a
reduce-scatter or an all-gather (n-1)/n x payload, at `interconnect_bytes_per_s` x an achievable
fraction (~0.8 of the unidirectional spec on NVLink, S02: A100 234.9 GB/s of 300; lower on PCIe,
S39); across nodes the node's NIC bandwidth. What each strategy can hide is in `exposed_comm`.
"""
from __future__ import annotations

from ..errors import TrainplanError
from ..strategy import DDP, DEVICES_PER_NODE, DP, SINGLE

DDP_BUCKET_BYTES = 25 * 2**20      # torch DDP bucket_cap_mb default (25 MiB): last bucket is exposed
NODE_NIC_BYTES_PER_S = 200e9       # per 8-GPU node across nodes: 1600 Gbit/s RoCE (S34 setup)


def node_bytes_per_s(job) -> float:
    """The network between nodes, bytes/s per node each way: the job's `internode_gbps` (Gbit/s,
    as clusters are sold), else NODE_NIC_BYTES_PER_S."""
    return NODE_NIC_BYTES_PER_S if job.internode_gbps is None else job.internode_gbps * 1e9 / 8


def link_fraction(accel) -> float:
    """Achievable share of the link's per-direction spec for NCCL collectives (S02, S39)."""
    ic = accel.interconnect.lower()
    if ic.startswith("nvlink") or ic == "ici":
        return 0.8          # S02: NCCL busbw 78% (A100 NVLink3), 82% (H200); ICI assumed alike
    return 0.5              # PCIe ring without NVLink: poor utilisation (S39); assumed, not measured


def collective_s(kind: str, payload_bytes: float, n: int, accel,
                 node_bytes: float = NODE_NIC_BYTES_PER_S) -> float:
    """Ring collective time: all-reduce 2(n-1)/n x payload, reduce-scatter/all-gather (n-1)/n (S02).

    Across nodes (n > 8 GPUs) NCCL runs one ring per NIC (channel); each ring enters and leaves a
    node once, so a NIC carries 1/8 of the ring traffic while NVLink carries all of it: the
    node's aggregate NIC bandwidth stands in for the per-GPU link, t = factor x payload /
    min(link, node NIC). With 1600 Gbit/s per node (S34) that is 200 GB/s, below NVLink 3;
    `node_bytes` is the job's network (node_bytes_per_s).
    """
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    bw = accel.interconnect_bytes_per_s or 0.0
    if accel.kind == "gpu" and n > DEVICES_PER_NODE:
        bw = min(bw, node_bytes)
    if bw <= 0:
        raise TrainplanError(f"No interconnect bandwidth for {accel.id!r}.",
                             fix="add interconnect_bytes_per_s to data/accelerators.csv")
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0,
              "all_to_all": 1.0}[kind] * (n - 1) / n
    return factor * payload_bytes / (bw * link_fraction(accel))


def exposed_comm(job, accel, meta, n, t_fwd, t_bwd, slowdown: float = 0.0
                 ) -> tuple[float, float, list]:
    """(exposed communication s, extra host overhead s, notes) for one optimizer step on n devices.

    `t_fwd`, `t_bwd`: device time of one micro-batch's forward and backward, the windows a
    strategy can hide its collectives in.
      DDP        all-reduce of the gradients, bucketed and overlapped with backward; the last
                 bucket is exposed. Once a step (no_sync on the other micro-batches), or after
                 every micro-batch where they sync each (`Strategy.reduces_each_micro_batch`).
      ZeRO-1/2   reduce-scatter of the gradients overlapped with backward (ZeRO-2: every
                 micro-batch, to keep only its shard; ZeRO-1: once), then an all-gather of the
                 updated parameters after the optimizer step, exposed.
      FSDP/ZeRO-3 per micro-batch: all-gather the parameters for forward and again for
                 backward; prefetched one unit ahead, so only what exceeds the compute window
                 (plus the first unit's gather) is exposed. The gradients are reduce-scattered
                 in the backward of every micro-batch that syncs: each one (ZeRO-3, Composer,
                 torchtune, sync_each_batch) or the last only (no_sync: accelerate's and the HF
                 Trainer's default), the reduce-scatter and the last unit's then exposed once.
      hybrid FSDP the same within each node (NVLink), and each reduce-scattered gradient shard
                 all-reduced between the nodes' replicas, in the backward window
                 (`replica_all_reduce_s`).
      DP         torch.nn.DataParallel: per micro-batch, broadcast the weights from GPU 0,
                 scatter inputs, gather outputs, reduce gradients to GPU 0; nothing overlaps.
    Expert parallelism adds its all-to-alls (`_all_to_all_s`) on top, exposed.

    A hidden collective is not free: NCCL's kernels run on the SMs beside the compute kernels
    and take thread blocks and HBM bandwidth from them (an H100 all-gather holds 24 of the 132
    SMs, NVIDIA developer forum thread 337991). Lee et al. 2025 (arXiv:2507.03114) measure the
    compute that overlaps a collective running `slowdown` = 18.9% slower on average (GPT and
    Llama steps on 4 A100s and H100s; 40% at most), so the step pays slowdown x the seconds of
    collectives hidden: those with nothing to hide behind (t_fwd = t_bwd = 0) less those
    exposed. `slowdown` is measured, not fitted (efficiency.json `overlap_slowdown`).
    """
    strat, notes = job.strategy, []
    if n <= 1 or strat is SINGLE:
        return 0.0, 0.0, notes
    a2a = _all_to_all_s(job, accel, meta)
    if a2a:
        notes.append(f"expert parallelism over {job.expert_parallel} GPUs: 4 all-to-alls of the "
                     "routed tokens per MoE layer and micro-batch, not overlapped")
    exposed, host, more = _data_parallel_comm(job, accel, meta, n, t_fwd, t_bwd)
    if accel.kind == "gpu" and n > DEVICES_PER_NODE:
        how = "the job's internode_gbps" if job.internode_gbps is not None else \
            "assumed; set internode_gbps to your cluster's"
        notes.append(f"between nodes {node_bytes_per_s(job) * 8 / 1e9:,.0f} Gbit/s a node ({how})")
    if slowdown > 0 and (t_fwd > 0 or t_bwd > 0):
        hidden = _data_parallel_comm(job, accel, meta, n, 0.0, 0.0)[0] - exposed
        if hidden > 0:
            exposed += slowdown * hidden
            more = more + [f"collectives hidden under compute slow it by {slowdown:.0%} while "
                           "they run (NCCL's kernels share the SMs, arXiv:2507.03114)"]
    return exposed + a2a * max(1, int(job.grad_accum)), host, notes + more


def replica_all_reduce_s(gradient_bytes: float, n: int, g: int, accel,
                         node_bytes: float = NODE_NIC_BYTES_PER_S) -> float:
    """Hybrid FSDP's all-reduce between replicas: after the reduce-scatter within a node, the
    g ranks of each node all-reduce their 1/g shard with the same rank of every other node
    (n / g replicas; torch FSDP1 `_post_reduce_grad_callback` / FSDP2 on a 2-D mesh). The g rings
    run at once through the node's NIC, so it carries 2(r-1)/r x (G/g) x g = 2(r-1)/r x G per
    direction, at the node's network (`node_bytes`); 0 on one node (g = n)."""
    if g >= n or gradient_bytes <= 0:
        return 0.0
    r = n / g
    if accel.kind != "gpu":
        return collective_s("all_reduce", gradient_bytes / g, max(2, round(r)), accel, node_bytes)
    return 2.0 * (r - 1) / r * gradient_bytes / node_bytes


def _all_to_all_s(job, accel, meta) -> float:
    """Expert parallelism: every MoE layer sends each routed (token, expert) pair's hidden state to
    the expert's rank and back (dispatch, combine), in forward and again in backward: 4 x T k h
    elements per layer and micro-batch, of which (ep - 1) / ep leave the rank (DeepSpeed
    sharded_moe.py `_AllToAll`, Megatron `MoEAlltoAllTokenDispatcher`)."""
    ep = job.expert_parallel
    elements = meta.get("moe_dispatch_elements", 0)
    if ep <= 1 or not elements:
        return 0.0
    return 4 * collective_s("all_to_all", elements * job.precision.compute_bytes, ep, accel,
                            node_bytes_per_s(job))


def _data_parallel_comm(job, accel, meta, n, t_fwd, t_bwd) -> tuple[float, float, list]:
    """The data-parallel strategy's collectives (`exposed_comm` says what each exposes); no host
    overhead of their own (the second value, 0)."""
    strat, notes = job.strategy, []
    node = node_bytes_per_s(job)
    k = max(1, int(job.grad_accum))
    syncs = k if strat.reduces_each_micro_batch(job.sync_each_batch) else 1
    grads = meta["gradient_bytes"]
    b = job.precision.compute_bytes
    p_compute = meta["params_total"] * b
    g_compute = meta.get("params_trainable", meta["params_total"]) * b
    if strat is DP:
        per_mb = (collective_s("all_gather", meta["weight_bytes"] * n / (n - 1), n, accel, node)
                  + collective_s("reduce_scatter", grads * n / (n - 1), n, accel, node))
        notes.append("DataParallel: one process, GIL-bound threads launch every device's kernels")
        return per_mb * k, 0.0, notes
    if strat is DDP or accel.kind == "tpu" and not strat.shards_weights:
        total = collective_s("all_reduce", grads, n, accel, node)
        last = collective_s("all_reduce", min(grads, DDP_BUCKET_BYTES), n, accel, node)
        return (last + max(0.0, total - last - t_bwd)) * syncs, 0.0, notes
    if strat.shards_optimizer and not strat.shards_weights:
        total = collective_s("reduce_scatter", grads, n, accel, node)
        last = collective_s("reduce_scatter", min(grads, DDP_BUCKET_BYTES), n, accel, node)
        rs = (last + max(0.0, total - last - t_bwd)) * syncs
        ag = collective_s("all_gather", p_compute, n, accel, node)
        notes.append(f"ZeRO-{strat.order}: gradients reduce-scattered during backward, updated "
                     "parameters all-gathered after the optimizer step")
        return rs + ag, 0.0, notes
    g = strat.shard_devices(n)      # all n, or one node's under hybrid FSDP
    ag = collective_s("all_gather", p_compute, g, accel, node)
    rs = collective_s("reduce_scatter", g_compute, g, accel, node)
    ar = replica_all_reduce_s(g_compute, n, g, accel, node)
    # the first unit's all-gather has no compute to hide behind: the largest wrapped block's
    # parameters, in the compute dtype (trace.largest_block_param_bytes is in the stored one)
    unit = meta.get("largest_block_param_bytes", 0.0) * p_compute / max(meta["weight_bytes"], 1.0)
    first = collective_s("all_gather", min(p_compute, unit or p_compute), g, accel, node)
    # ... nor the last unit's gradient reduce-scatter (the first block, last in backward)
    last_unit = min(g_compute, unit or g_compute)
    last = collective_s("reduce_scatter", last_unit, g, accel, node) \
        + replica_all_reduce_s(last_unit, n, g, accel, node)
    synced = first + last + max(0.0, ag - t_fwd) + max(0.0, ag + rs + ar - t_bwd)
    unsynced = first + max(0.0, ag - t_fwd) + max(0.0, ag - t_bwd)     # under no_sync
    if g < n:
        notes.append(f"hybrid sharding: FSDP within each node of {g} GPUs, gradient shards "
                     f"all-reduced between the {n / g:g} nodes' replicas")
    if k > 1 and syncs == 1:
        notes.append(f"gradients reduce-scattered on the last of {k} micro-batches only "
                     "(no_sync before it: accelerate's and the HF Trainer's default; "
                     "sync_each_batch: true reduce-scatters each and holds only shards)")
    return synced * syncs + unsynced * (k - syncs), 0.0, notes
