"""A DeepSpeed JSON config: ZeRO stage, CPU offload, fp16/bf16, micro-batch and accumulation.

    zero_optimization.stage 0..3     -> strategy ddp (0, several devices), zero1, zero2, zero3
    offload_optimizer.device cpu     -> offload optimizer; with offload_param cpu (stage 3):
                                        optimizer+params
    bf16.enabled / fp16.enabled      -> bf16-amp / fp16-amp: DeepSpeed casts the model to 16 bits
                                        and keeps fp32 master weights in its optimizer, the bytes
                                        per parameter trainplan's AMP precisions hold (16 with
                                        Adam); neither: fp32
    train_micro_batch_size_per_gpu,  -> micro-batch, accumulation; train_batch_size with both
    gradient_accumulation_steps,        gives the number of devices (DeepSpeed checks
    train_batch_size                    train_batch_size = micro x accumulation x world size)
    optimizer.type                   -> DeepSpeed's optimizer replaces the trainer's own

"auto" is not DeepSpeed's: the HF Trainer and accelerate fill it before DeepSpeed sees the config,
and so does this reader, from the training config beside it (`Trainer`):

- transformers `HfTrainerDeepSpeedConfig.trainer_config_process`
  (src/transformers/integrations/deepspeed.py, 5.24.0): train_micro_batch_size_per_gpu <-
  per_device_train_batch_size, gradient_accumulation_steps <- gradient_accumulation_steps,
  train_batch_size <- world_size x both, gradient_clipping <- max_grad_norm, fp16.enabled <-
  fp16 or fp16_full_eval, bf16.enabled <- bf16 or bf16_full_eval, optimizer/scheduler params <-
  learning rate, betas, ... A value that is not "auto" must equal the trainer's (`fill_match`
  collects mismatches and raises); `trainer_config_finalize`: zero_optimization
  reduce_bucket_size <- hidden_size^2, stage3_prefetch_bucket_size <- 0.9 hidden_size^2,
  stage3_param_persistence_threshold <- 10 hidden_size (the sizes predict/sharding.py plans).
- accelerate `DeepSpeedPlugin.__post_init__` (src/accelerate/utils/dataclasses.py,
  huggingface/accelerate@16cb6eb): a config without gradient_accumulation_steps gets 1; the
  plugin's gradient_accumulation_steps, gradient_clipping, zero_stage and offload devices fill
  "auto"; `Accelerator._prepare_deepspeed` fills the micro-batch from the dataloader.
- DeepSpeed `DeepSpeedConfig._set_batch_related_parameters` (deepspeed/runtime/config.py,
  deepspeedai/DeepSpeed@edaa722): of train_batch_size, train_micro_batch_size_per_gpu and
  gradient_accumulation_steps, the missing ones are derived from the others and the world size
  (accumulation 1 when only one batch size is given).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import TrainplanError
from .common import clip_norm, clipping_text, known_keys
from .reading import Collector, Reading, show

AUTO = "auto"
HIDDEN_SIZED = {"reduce_bucket_size": "hidden_size^2",
                "stage3_prefetch_bucket_size": "0.9 x hidden_size^2",
                "stage3_param_persistence_threshold": "10 x hidden_size"}
# zero_optimization keys whose value changes memory or time away from DeepSpeed's default
# (deepspeed/runtime/zero/config.py DeepSpeedZeroConfig), what trainplan plans instead; the
# stage-3 ones are also spelled without `stage3_` (their pydantic aliases)
ZERO_UNMODELLED = {
    "allgather_bucket_size": (5e8, "planned with the allgather of each parameter group, not "
                                   "its bucket"),
    "stage3_max_live_parameters": (1e9, "planned with the block computing and the prefetch "
                                        "bucket held"),
    "stage3_max_reuse_distance": (1e9, "planned with DeepSpeed's default reuse distance"),
    "sub_group_size": (1e9, "planned with DeepSpeed's default optimizer sub-group"),
    "zero_quantized_weights": (False, "ZeRO++ quantised weight all-gather: planned in 16 bits"),
    "zero_quantized_gradients": (False, "ZeRO++ quantised gradients: planned in 16 bits"),
    "zero_hpz_partition_size": (1, "ZeRO++ hierarchical partitioning: planned as one "
                                   "partition"),
    "mics_shard_size": (-1, "MiCS sharding over sub-groups: planned over every device"),
}
TOP_UNMODELLED = {
    "activation_checkpointing": "DeepSpeed's own checkpointing API (the model must call it); the "
                                "trainer's gradient checkpointing is what is planned",
    "compression_training": "compression training is not modelled",
    "sparse_attention": "sparse attention is not modelled",
    "pipeline": "pipeline parallelism is not modelled",
    "sequence_parallel_size": "sequence parallelism is not modelled",
    "tensor_parallel": "tensor parallelism (AutoTP) is not modelled",
    "data_types": "gradient accumulation dtype: planned in the parameters' dtype",
    "communication_data_type": "planned with communication in the compute dtype",
    "fp8": "fp8 training is not modelled: planned in bf16",
    "torch_autocast": "DeepSpeed's torch autocast: planned as its 16-bit mode",
    "compile": "DeepSpeed compile is not modelled",
}
OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "cpuadam": "adamw", "fusedadam": "adamw",
              "lion": "lion", "sgd": "sgd", "adagrad": None, "lamb": None, "onebitadam": None,
              "zerooneadam": None, "onebitlamb": None, "muon": None, "muonwithauxadam": None}


@dataclass(frozen=True)
class Trainer:
    """What the training config beside a DeepSpeed config gives its "auto" values."""

    source: str                      # "axolotl", "the HF Trainer arguments", "accelerate", ...
    micro_batch: int | None = None
    grad_accum: int | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    world: int | None = None
    max_grad_norm: float | None = None   # the trainer's clipping norm (None: none, or not known)
    strict: bool = True              # the HF Trainer refuses a value it did not ask for; beside
                                     # a trainplan job (--deepspeed) DeepSpeed's explicit values win


def looks_like(data: dict) -> bool:
    models = {"model", "base_model", "model_name_or_path"}
    return "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data or (
        "train_batch_size" in data and not models & set(data))


def _enabled(value: Any) -> bool:
    """A section is on unless it says `enabled: false` (or is empty)."""
    if isinstance(value, dict):
        return bool(value) and value.get("enabled", True) not in (False, "false")
    return bool(value)


def read(data: dict, path: str, beside: Trainer | None = None, gpus: int | None = None) -> Reading:
    keys, sections = known_keys("deepspeed")
    c = Collector("deepspeed", path, data, set(keys))
    _batch(c, beside, gpus)
    _clipping(c, beside)
    _zero(c, sections)
    _precision(c, sections, beside)
    opt = c.section("optimizer", {"type", "params"})
    if opt.has("type"):
        name = str(opt.take("type"))
        mapped = OPTIMIZERS.get(name.lower().replace("_", ""), None)
        if mapped:
            opt.read("type", name, f"optimizer {mapped} (DeepSpeed's, in place of the "
                                   "trainer's)", optimizer=mapped)
        else:
            opt.unmodelled("type", name, "not an optimizer trainplan models: planned as AdamW")
            c.set(optimizer="adamw")
    c.section("scheduler", {"type", "params"})
    for key, why in TOP_UNMODELLED.items():
        v = c.data.get(key)
        if v not in (None, False, {}, []) and _enabled(v):
            c.unmodelled(key, v, why)
    return c.finish()


def _resolve(c: Collector, key: str, beside_value, beside: Trainer | None, what: str):
    """A batch field: its value, "auto" filled from the trainer, or a mismatch error."""
    v = c.take(key)
    if v == AUTO:
        if beside_value is not None:
            c.assume(f"{key} \"auto\": {beside_value}, the {what} of {beside.source} (as the HF "
                     "Trainer / accelerate fill it)")
            return beside_value, True
        return None, True
    if v is not None:
        v = c.int_(key, v)
        if beside_value is not None and v != beside_value and beside.strict:
            raise c.error(key, f"{v} while {beside.source} sets the {what} to {beside_value}: "
                          "the HF Trainer and accelerate refuse a DeepSpeed value that differs "
                          "from the trainer's.",
                          fix=f"set {key} to \"auto\" (or to {beside_value})")
    return v, False


def _clipping(c: Collector, beside: Trainer | None) -> None:
    """`gradient_clipping`: DeepSpeed clips the gradients' global norm to it before every step
    (engine.py `clip_fp32_gradients` / ZeRO's `unscale_and_clip_grads`); 0, its default, clips
    nothing. "auto" is the trainer's `max_grad_norm` (the HF Trainer's; accelerate's plugin)."""
    key = "gradient_clipping"
    if key not in c.data:
        return
    b = beside or Trainer("nothing")
    raw = c.take(key)
    if raw == AUTO:
        if b.max_grad_norm is None and b.source in ("nothing", "accelerate"):
            c.read(key, raw, "the training script's clipping (filled by the HF Trainer or "
                             "accelerate; --max-grad-norm to plan it)")
            return
        norm = b.max_grad_norm
        c.read(key, raw, f"{clipping_text(norm)} (max_grad_norm of {b.source})",
               max_grad_norm=norm)
        return
    norm = clip_norm(c, key, raw)
    theirs = b.max_grad_norm or 0.0
    if b.strict and b.source != "nothing" and norm != theirs:
        raise c.error(key, f"{show(norm)} while {b.source} clips to {show(theirs)} "
                      "(max_grad_norm): the HF Trainer and accelerate refuse a DeepSpeed value "
                      "that differs from the trainer's.",
                      fix=f"set {key} to \"auto\" (or to {show(theirs)})")
    c.read(key, raw, clipping_text(norm), max_grad_norm=norm or None)


def _batch(c: Collector, beside: Trainer | None, gpus: int | None) -> None:
    b = beside or Trainer("nothing")
    mbs_raw = c.data.get("train_micro_batch_size_per_gpu")
    gas_raw = c.data.get("gradient_accumulation_steps")
    tbs_raw = c.take("train_batch_size")
    mbs, _ = _resolve(c, "train_micro_batch_size_per_gpu", b.micro_batch, b, "micro-batch")
    gas, _ = _resolve(c, "gradient_accumulation_steps", b.grad_accum, b, "accumulation")
    tbs = None if tbs_raw in (None, AUTO) else c.int_("train_batch_size", tbs_raw)
    world = gpus or b.world
    derived = ""
    if tbs is not None and mbs and gas:
        if tbs % (mbs * gas):
            raise c.error("train_batch_size", f"{tbs} is not micro-batch x accumulation x "
                          f"devices ({mbs} x {gas} x N): DeepSpeed refuses it.")
        world = tbs // (mbs * gas)
        c.read("train_batch_size", tbs_raw, f"{world} device(s): {tbs} = {mbs} x {gas} x "
                                            f"{world}", gpus=world)
    elif tbs is not None:                      # DeepSpeed derives what is missing
        w = world or 1
        if mbs:
            gas = max(1, tbs // mbs // w)
        elif gas:
            mbs = max(1, tbs // w // gas)
        else:
            mbs, gas = max(1, tbs // w), 1
        derived = f" (DeepSpeed's derivation from train_batch_size {tbs} over {w} device(s))"
        c.read("train_batch_size", tbs_raw, f"micro-batch {mbs}, accumulation {gas} over {w} "
                                            "device(s)", batch_size=mbs, grad_accum=gas)
    elif tbs_raw == AUTO:
        c.read("train_batch_size", tbs_raw, "micro-batch x accumulation x devices (filled by "
                                            "the HF Trainer / accelerate)")
    if mbs is not None and gas is None and gas_raw is None:
        gas = 1
        c.assume("gradient_accumulation_steps not given: 1 (DeepSpeed's derivation; accelerate "
                 "sets 1 too)")
    if "train_micro_batch_size_per_gpu" in c.data:
        c.read("train_micro_batch_size_per_gpu", mbs_raw,
               f"micro-batch {mbs}{derived}" if mbs is not None else
               "micro-batch of the training script (not given here: --batch-size, else "
               "trainplan's default 1)", **({"batch_size": mbs} if mbs is not None else {}))
    if "gradient_accumulation_steps" in c.data:
        c.read("gradient_accumulation_steps", gas_raw,
               f"gradient accumulation {gas}{derived}" if gas is not None else
               "accumulation of the training script (not given here: --grad-accum, else 1)",
               **({"grad_accum": gas} if gas is not None else {}))
    elif gas is not None:
        c.set(grad_accum=gas)


def _zero(c: Collector, sections: dict) -> None:
    z = c.section("zero_optimization", set(sections.get("zero_optimization", ())))
    stage = z.take("stage", 0)
    if stage == AUTO or stage not in (0, 1, 2, 3):
        raise z.error("stage", f"{show(stage)} is not a ZeRO stage.", allowed="0, 1, 2, 3")
    strategy = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    meaning = {0: "data parallel, nothing sharded (DDP over several devices)",
               1: "strategy zero1", 2: "strategy zero2", 3: "strategy zero3"}[stage]
    if "stage" in z.data:
        z.read("stage", stage, meaning, strategy=strategy)
    else:
        c.assume("no ZeRO stage: 0 (DeepSpeed's default): data parallel, nothing sharded")
        c.set(strategy=strategy)
    offload = "none"
    for key, what in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        sub = z.section(key, set(sections.get(key, ())))
        device = sub.take("device", "none")
        if device == AUTO:
            device = "none"
        if device in ("cpu", "nvme"):
            if what == "optimizer":
                offload = "optimizer"
                sub.read("device", device, "offload optimizer (CPU: the optimizer state and "
                         "its step on the host)" + (", NVMe planned as CPU" if device == "nvme"
                                                    else ""))
            elif stage == 3:
                offload = "optimizer+params"
                sub.read("device", device, "offload optimizer+params (the parameters too)")
                if not z.data.get("offload_optimizer"):
                    sub.assume("offload_param without offload_optimizer: planned with both "
                               "offloaded (trainplan's offload levels)")
            else:
                sub.unmodelled("device", device, "parameter offload needs stage 3: DeepSpeed "
                               "ignores it below")
            if device == "nvme":
                sub.unmodelled("nvme_path", sub.data.get("nvme_path"), "NVMe offload: planned "
                               "as CPU offload (host memory, PCIe)")
        elif device not in ("none", None):
            raise sub.error("device", f"{show(device)} is not an offload device.",
                            allowed="none, cpu, nvme")
    c.set(offload=offload)
    for key, size in HIDDEN_SIZED.items():
        for spelled in dict.fromkeys((key, key.replace("stage3_", ""))):
            if spelled in z.data:
                v = z.take(spelled)
                if v == AUTO:
                    z.read(spelled, v, f"{size} (as the HF Trainer / accelerate fill it; "
                                       "what trainplan plans)")
                else:
                    z.unmodelled(spelled, v, f"planned with {size} elements (the HF Trainer's "
                                             "\"auto\")")
    for key, (default, why) in ZERO_UNMODELLED.items():
        for spelled in dict.fromkeys((key, key.replace("stage3_", ""))):
            v = z.data.get(spelled)
            if v is not None and v != default:
                z.unmodelled(spelled, z.take(spelled), why)


def _precision(c: Collector, sections: dict, beside: Trainer | None) -> None:
    b = beside or Trainer("nothing")
    got = {}
    for name, trainer_value in (("bf16", b.bf16), ("fp16", b.fp16)):
        sec = c.section(name, set(sections.get(name, ())) | {"enabled"})
        if name == "bf16" and not sec.data and "bfloat16" in c.data:
            sec = c.section("bfloat16", set(sections.get(name, ())) | {"enabled"})
        if not sec.data:
            continue
        v = sec.take("enabled", False)
        if v == AUTO and trainer_value is None:
            sec.read("enabled", AUTO, f"the training script's {name} flag (not given here: "
                                      "--precision)")
            continue
        if v == AUTO:
            v = bool(trainer_value)
            sec.read("enabled", AUTO, f"{'on' if v else 'off'}: {name} of {b.source}")
        else:
            if b.strict and trainer_value is not None and bool(v) != bool(trainer_value):
                raise sec.error("enabled", f"{show(v)} while {b.source} sets {name} "
                                f"{'on' if trainer_value else 'off'}: the HF Trainer refuses a "
                                "DeepSpeed value that differs from its own.",
                                fix=f"set {name}.enabled to \"auto\"")
            sec.read("enabled", v, f"{name} {'on' if v else 'off'}")
        got[name] = bool(v)
    if got.get("bf16"):
        c.set(precision="bf16-amp")
        c.assume("bf16 enabled: the model in bf16, fp32 master weights in DeepSpeed's optimizer "
                 "(planned as bf16-amp: the same 16 bytes a parameter with Adam)")
    elif got.get("fp16"):
        c.set(precision="fp16-amp")
        c.assume("fp16 enabled: the model in fp16, fp32 master weights and dynamic loss scaling "
                 "in DeepSpeed's optimizer (planned as fp16-amp)")
    elif got:
        c.set(precision="fp32")


def apply(settings: dict, ds: Reading) -> dict:
    """The training config's settings with the DeepSpeed config's over them (ZeRO stage, offload,
    16-bit mode, DeepSpeed's optimizer, a world size it pins)."""
    out = dict(settings)
    for key in ("strategy", "offload", "precision", "optimizer", "gpus", "batch_size",
                "grad_accum", "max_grad_norm"):
        if key in ds.settings:
            out[key] = ds.settings[key]
    if out.get("strategy") == "ddp" and (out.get("gpus") or 1) == 1:
        out.pop("strategy")
    return out


def check_stage(value: Any, where: str) -> int:
    if value not in (0, 1, 2, 3):
        raise TrainplanError(f"{where}: {show(value)} is not a ZeRO stage.", allowed="0, 1, 2, 3")
    return value
