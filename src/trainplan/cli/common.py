"""Flags shared by subcommands, and turning them (plus an optional YAML job) into a Job.

Precedence: CLI flags > YAML file > defaults.
"""
from __future__ import annotations

import argparse
from dataclasses import fields, replace

from ..algorithm import ALGORITHMS, ENGINES, Rollout, parse_rollout
from ..errors import TrainplanError
from ..models.hub import set_allow_download
from ..strategy import SINGLE
from ..spec import (ATTENTIONS, CHECKPOINT_IMPLS, FROZEN_HALF, OFFLOADS,
                    OPTIMIZERS, PRECISIONS, QUANTIZE, STRATEGIES, TASKS, Job, Lora, validate)


def add_job_flags(p: argparse.ArgumentParser, model_positional: bool = False) -> None:
    g = p.add_argument_group("job (override the YAML job file)")
    if not model_positional:
        g.add_argument("--model", help="hf:<id>, hf:./config.json, timm:<name>, torchvision:<name>, "
                                       "transformer, py:<module>:<factory>")
    g.add_argument("--job", dest="job_file", help="YAML job file, or an axolotl, LLaMA-Factory, "
                                                  "TRL, torchtune, DeepSpeed or accelerate config")
    g.add_argument("--deepspeed", metavar="DS_JSON",
                   help="a DeepSpeed config beside the job (its ZeRO stage, offload, 16-bit mode; "
                        "\"auto\" filled from the job)")
    g.add_argument("--accelerate", metavar="ACC_YAML",
                   help="an accelerate config beside the job (its processes, strategy, "
                        "mixed precision)")
    g.add_argument("--gpu", help="accelerator id (trainplan catalog)")
    g.add_argument("--gpus", type=int, help="devices")
    g.add_argument("--strategy", choices=STRATEGIES)
    g.add_argument("--offload", choices=OFFLOADS)
    g.add_argument("--batch-size", type=int, help="micro-batch per device")
    g.add_argument("--grad-accum", type=int, help="gradient accumulation steps")
    g.add_argument("--seq-len", type=int)
    g.add_argument("--image-size", type=int, help="image side in pixels (vision models; "
                                                  "vision-language models: each image)")
    g.add_argument("--images-per-sample", type=int,
                   help="vision-language models: images in each sample (default 1 when "
                        "--image-size is given)")
    g.add_argument("--precision", help="|".join(PRECISIONS))
    g.add_argument("--optimizer", help="|".join(OPTIMIZERS))
    g.add_argument("--grad-checkpointing", metavar="{none,full,selective,every-K}",
                   help="activation checkpointing: every block in full, selectively (torchtitan's "
                        "op policy), or every K-th block in full (torchtitan/torchtune ac_option)")
    g.add_argument("--checkpoint-impl", choices=CHECKPOINT_IMPLS,
                   help="torch.utils.checkpoint's use_reentrant (auto: reentrant for QLoRA, as "
                        "peft sets it up; non-reentrant otherwise, as transformers 5 does)")
    g.add_argument("--attention", choices=ATTENTIONS)
    g.add_argument("--lora-rank", type=int)
    g.add_argument("--lora-alpha", type=float)
    g.add_argument("--lora-targets", help="all-linear or q,v,... or module-name suffixes")
    g.add_argument("--quantize", help="|".join(QUANTIZE) + " (QLoRA base weights)")
    g.add_argument("--frozen-half", choices=FROZEN_HALF,
                   help="under mixed precision, keep frozen parameters in 16 bits: embeddings "
                        "(and head) or all (default none: fp32, as peft's "
                        "prepare_model_for_kbit_training upcasts them)")
    g.add_argument("--expert-parallel", type=int,
                   help="mixture-of-experts: split the experts over this many GPUs (a divisor "
                        "of --gpus; default 1)")
    g.add_argument("--moe-capacity-factor", type=float,
                   help="mixture-of-experts: tokens per expert = factor x the uniform share "
                        "(default: dropless, uniform routing)")
    g.add_argument("--internode-gbps", type=float,
                   help="the network between nodes, Gbit/s per 8-GPU node each way (e.g. 400 "
                        "for 4 x 100G EFA; default 1600): jobs over more than one node")
    g.add_argument("--algorithm", help="|".join(ALGORITHMS) + " (default sft; grpo/ppo generate "
                                       "completions every step, dpo runs chosen and rejected)")
    g.add_argument("--generations", type=int, help="grpo/ppo: completions per prompt (TRL "
                                                   "num_generations, default 8)")
    g.add_argument("--prompt-len", type=int, help="grpo/ppo: prompt tokens (default 512)")
    g.add_argument("--completion-len", type=int,
                   help="grpo/ppo: generated tokens (TRL max_completion_length, default 256)")
    g.add_argument("--engine", help="grpo/ppo generation: " + "|".join(ENGINES) + " (default hf: "
                                    "model.generate in the training process)")
    g.add_argument("--beta", type=float, help="grpo/ppo: KL coefficient; > 0 runs the reference "
                                              "model (default 0)")
    g.add_argument("--channels-last", action="store_true", default=None)
    g.add_argument("--sync-each-batch", action="store_true", default=None,
                   help="with --grad-accum > 1, reduce the gradients after every micro-batch "
                        "(accelerate's GradientAccumulationPlugin(sync_each_batch=True); "
                        "Composer and torchtune do): under FSDP only gradient shards are kept")
    g.add_argument("--max-grad-norm", type=float,
                   help="clip the gradients' global norm to this before every optimizer step "
                        "(torch.nn.utils.clip_grad_norm_; the HF Trainer's max_grad_norm, 1.0 "
                        "there by default); default: no clipping")
    g.add_argument("--expandable-segments", action="store_true", default=None,
                   help="the job runs with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                        "(CUDA's allocator then grows one segment; less reserved memory)")
    g.add_argument("--task", choices=TASKS + ("generate",),
                   help="the model's training task; `estimate --task generate`: inference only "
                        "(prefill + decode of --batch-size sequences, --prompt-len + "
                        "--completion-len tokens)")
    g.add_argument("--allow-download", action="store_true",
                   help="hf:<hub id> that trainplan does not bundle: download only its "
                        "config.json from the Hugging Face Hub (also TRAINPLAN_ALLOW_DOWNLOAD=1; "
                        "honours HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE)")


def steps_arg(text: str) -> int:
    """argparse type of --steps: a whole number (1000, 1e6), within spec.MAX_STEPS."""
    from ..spec import MAX_STEPS
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps") from None
    if value != value or value < 1 or (value < 2**53 and value != int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of steps")
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"{text} is out of range: at most {MAX_STEPS:.0e} "
                                         "optimizer steps")
    return int(text) if text.strip().lstrip("+").isdigit() else int(value)


_MAP = {"gpu": "gpu", "gpus": "gpus", "strategy": "strategy", "offload": "offload",
        "batch_size": "batch_size", "grad_accum": "grad_accum", "seq_len": "seq_len",
        "image_size": "image_size", "images_per_sample": "images_per_sample",
        "precision": "precision", "optimizer": "optimizer",
        "grad_checkpointing": "grad_checkpointing", "checkpoint_impl": "checkpoint_impl",
        "attention": "attention",
        "quantize": "quantize", "frozen_half": "frozen_half", "channels_last": "channels_last",
        "expandable_segments": "expandable_segments", "sync_each_batch": "sync_each_batch",
        "task": "task",
        "moe_capacity_factor": "moe_capacity_factor", "expert_parallel": "expert_parallel",
        "internode_gbps": "internode_gbps", "max_grad_norm": "max_grad_norm",
        "algorithm": "algorithm"}
_ROLLOUT_FLAGS = {"generations": "generations", "prompt_len": "prompt_len",
                  "completion_len": "completion_len", "engine": "engine", "beta": "beta"}


def job_from_args(args: argparse.Namespace, job_file: str | None = None) -> Job:
    """The job: a trainplan YAML or a framework's config (configs/), the flags over it. What a
    framework config became is kept in `args.config_reading` (shown by `show_reading`)."""
    set_allow_download(getattr(args, "allow_download", False))
    path = job_file or getattr(args, "job_file", None)
    ds, acc = getattr(args, "deepspeed", None), getattr(args, "accelerate", None)
    reading = None
    if path or ds or acc:
        from ..configs import load as load_config
        job, reading = load_config(path, deepspeed=ds, accelerate=acc)
    else:
        job = Job()
    args.config_reading = reading
    kw = {}
    model = getattr(args, "model", None)
    if model:
        kw["model"] = model
        if model != "transformer" and not path:
            kw["transformer"] = None
    for a, f in _MAP.items():
        v = getattr(args, a, None)
        if v is not None:
            kw[f] = v
    if kw.get("gpus") and kw["gpus"] > 1 and "strategy" not in kw and job.strategy is SINGLE:
        kw["strategy"] = "ddp"
    if args.lora_rank is not None or args.lora_targets is not None or args.lora_alpha is not None:
        base = job.lora or Lora()
        kw["lora"] = replace(base, **{k: v for k, v in (("rank", args.lora_rank),
                                                        ("alpha", args.lora_alpha),
                                                        ("targets", args.lora_targets))
                                      if v is not None})
    rollout = {f: getattr(args, a) for a, f in _ROLLOUT_FLAGS.items()
               if getattr(args, a, None) is not None}
    if rollout:
        base = {f.name: getattr(job.rollout, f.name) for f in fields(Rollout)} if job.rollout else {}
        kw["rollout"] = parse_rollout({**base, **rollout}, "the rollout flags")
        if job.rollout and "seq_len" not in kw and any(k in rollout for k in ("prompt_len",
                                                                              "completion_len")):
            kw["seq_len"] = None      # the job file's seq_len was its old prompt + completion
    job = replace(job, **kw)
    if job.model == "transformer" and job.transformer is None:
        named = f"The {reading.label} config {reading.path} names no model." if (
            reading is not None and reading.kind not in ("trainplan",)) else "No model given."
        raise TrainplanError(named,
                             fix="pass --model (e.g. hf:google-bert/bert-large-uncased) or a job "
                                 "file (e.g. examples/graphmer-se.yaml)")
    try:
        return validate(job)
    except TrainplanError as e:     # say which file named a model trainplan cannot find
        if reading is None or reading.kind == "trainplan" or "model" in kw or \
                not e.what.startswith("Unknown model"):
            raise
        raise TrainplanError(f"{reading.label} config {reading.path}: {e.what}",
                             allowed=e.allowed, fix=e.fix) from None


def show_reading(args: argparse.Namespace, stream=None) -> None:
    """What the framework configs became (configs/reading.py), before the results."""
    import sys
    reading = getattr(args, "config_reading", None)
    lines = reading.lines() if reading is not None else []
    if lines:
        print("\n".join(lines) + "\n", file=stream or sys.stdout, flush=True)


NOMINAL_STEPS = 1000   # a unit to read time and cost in, not an estimate of the run's length


def run_length(args: argparse.Namespace, job: Job) -> Job:
    """A framework config gives epochs but not the dataset's size (its datasets are named, not
    counted): plan NOMINAL_STEPS optimizer steps so that time to finish and cost read per that
    many, and say so. --steps, or --dataset-size with the epochs, give the real length."""
    reading = getattr(args, "config_reading", None)
    if reading is None or reading.kind == "trainplan" or job.steps or job.dataset_size or \
            getattr(args, "epochs", None) is not None:
        return job
    what = f"{job.epochs:g} epoch(s)" if job.epochs else "no length"
    note = (f"run length: the {reading.label} config gives {what} over a dataset whose size it "
            f"does not give; planned {NOMINAL_STEPS:,} optimizer steps, so time and cost read "
            "per that many (give --dataset-size N or --steps N)")
    return job.with_(steps=NOMINAL_STEPS, notes=job.notes + (note,))
