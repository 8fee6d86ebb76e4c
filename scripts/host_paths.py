"""What a transformers model's own code costs the host per kernel, by path, on this CPU.

Run: python scripts/host_paths.py
     python scripts/host_paths.py --models bert,gpt2,llama,qwen2   (by model, below)
     python scripts/host_paths.py --modules                        (per module, below)

scripts/host_dispatch.py measures PyTorch's dispatch by path on bare functional ops; the time
model's host costs (predict/host.py) are built from those, times one fitted scale. This measures
the same paths through a real transformers decoder (Qwen2's code: 24 layers, hidden 64, so the
kernels cost next to nothing on the CPU and what is timed is the host's work), each as seconds
per kernel dispatched (the views and other kernel-less ops between kernels included in the
time): a training forward under autograd, its backward, a decode step of `generate` (no grad, KV
cache, greedy), and the training step with every layer checkpointed as trainplan's traces and
`trainplan measure` checkpoint it (trace/checkpointing.py: torch.utils.checkpoint, non-reentrant,
one block a layer). Best of 20 (generate: of 5, per token between 16 and 64 new tokens).

The checkpointed step's host time beyond its forward and backward kernels at the plain step's
costs, over the kernels its backward reruns, is a rerun kernel's cost: the rerun op's own forward
dispatch (one forward kernel) and the checkpoint's work (a pack hook on every tensor the block
saves in the forward, the unpack, the rerun's bookkeeping and its check of what it recomputed)
spread over them. That work, a rerun kernel's cost less a forward kernel, is Python with no
kernel launch in it: scripts/calibrate_time.py CHECKPOINT_S (predict/host.py `checkpoint_s`).
docs/validation.md says what each figure shows and what the fit does with it.

`--models`: the training step's forward and backward, seconds per kernel, through each named
model's own transformers code at the same tiny shape (24 layers, hidden 64, SDPA, 8 tokens;
the models measured in turn, five rounds, the least of each):
what one host spends per kernel on different model code, which the time model's per-path costs
(the same for every model) do not tell apart.

`--modules`: what separates them. A model's forward is its kernels' dispatch plus the Python of
its modules (each module entered runs its own forward: attribute reads, shape arithmetic, config
checks), so per model

    forward - views x view = a x kernels + c x modules entered
    backward               = b x (kernels + views)        (every backward op an autograd node's)

fitted by least squares on BERT, GPT-2 and Llama (the same tiny shape, SDPA) and checked on two
code bases the fit never saw: T5 (encoder-decoder, relative position bias) and ViT. The module's
cost is printed as c / a, a multiple of a forward kernel's, which stays put as the CPU's speed
wanders; x host_dispatch.py's forward_op_s it is predict/host.py's `module_s`
(scripts/calibrate_time.py MODULE_KERNELS). The backward's fit with kernels and views apart says
whether a view there costs a kernel's (host_dispatch.py counts both as backward ops).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.modules.setdefault("torchvision", None)    # transformers' optional import; not needed here
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from host_dispatch import VIEWS, Count, best, view_seconds  # noqa: E402  (scripts/)

# a model's code also reshapes and splits: kernel-less there too
MODEL_VIEWS = VIEWS | {"reshape", "_reshape_alias", "split", "unbind", "split_with_sizes", "chunk"}


def _model(checkpointed: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trainplan.trace.checkpointing import apply_checkpointing
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=24,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
                      attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg)
    if checkpointed:
        apply_checkpointing(model, "full")
    return model


def _kernels(forward) -> tuple[int, int]:
    """(forward kernels, backward kernels) of one training step, `forward` returning its loss."""
    k_f, _, _, k_b, _ = _counts(forward)
    return k_f, k_b


def _counts(forward) -> tuple[int, int, int, int, int]:
    """(forward kernels, forward views, modules entered, backward kernels, backward views) of one
    training step, `forward` returning its loss."""
    calls = [0]

    def entered(module, args) -> None:
        calls[0] += 1
    c = Count(MODEL_VIEWS)
    hook = torch.nn.modules.module.register_module_forward_pre_hook(entered)
    try:
        with c:
            loss = forward()
            k_f, v_f = c.kernels, c.views
            hook.remove()
            loss.backward()
    finally:
        hook.remove()
    return k_f, v_f, calls[0], c.kernels - k_f, c.views - v_f


def _tiny(name: str):
    """`name`'s transformers model at the shape `_model` uses (24 layers, hidden 64)."""
    import transformers as tf
    torch.manual_seed(0)
    common = dict(vocab_size=256, attn_implementation="sdpa")
    if name == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=64, d_ff=128, d_kv=32, num_layers=12, num_decoder_layers=12, num_heads=2,
            decoder_start_token_id=0, pad_token_id=0, **common))
    if name == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(
            image_size=64, patch_size=16, hidden_size=64, intermediate_size=128,
            num_hidden_layers=24, num_attention_heads=2, num_labels=10,
            attn_implementation="sdpa"))
    if name == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=24, num_attention_heads=2,
                                                **common))
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=24, n_head=2, bos_token_id=0,
                                                eos_token_id=0, **common))
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128,
                                                  num_hidden_layers=24, num_attention_heads=2,
                                                  num_key_value_heads=1, **common))
    if name == "qwen2":
        return _model(False)
    raise SystemExit(f"--models: {name!r} is not one of bert, gpt2, llama, qwen2, t5, vit")


ROUNDS = 5


def _loss(model, ids):
    """A function running `model`'s training forward on `ids` (an image batch for ViT)."""
    from transformers import ViTConfig
    if isinstance(getattr(model, "config", None), ViTConfig):
        image = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        return lambda: model(pixel_values=image).logits.float().sum()
    return lambda: model(input_ids=ids, labels=ids).loss


def _fresh_step(model, ids, repeat: int = 20) -> tuple[float, float, int, int]:
    """`_training`'s figures for a step that starts with no gradients (`zero_grad(set_to_none)`,
    as a training loop does), the forward and the backward timed apart within each step (the
    least of `repeat` of each), so every round runs and counts the same kernels and no
    difference of two noisy minima stands for the backward."""
    forward = _loss(model, ids)

    model.zero_grad(set_to_none=True)
    k_fwd, k_bwd = _kernels(forward)
    t_f = t_b = float("inf")
    for _ in range(repeat + 1):        # the first warms up
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        t_f, t_b = min(t_f, t1 - t0), min(t_b, t2 - t1)
    return t_f, t_b, k_fwd, k_bwd


def by_model(names: list[str]) -> int:
    torch.set_num_threads(1)        # as host_dispatch.py: one thread issues, as on a GPU host
    ids = torch.randint(0, 256, (1, 8))
    models = {n: _tiny(n) for n in names}
    runs = {n: [] for n in names}
    for _ in range(ROUNDS):         # interleaved, the least of each: this CPU's speed wanders
        for n, model in models.items():
            runs[n].append(_fresh_step(model, ids))
    for name in names:
        t_f, t_b = min(r[0] for r in runs[name]), min(r[1] for r in runs[name])
        k_f, k_b = runs[name][0][2], runs[name][0][3]
        step = (t_f + t_b) / (k_f + k_b)
        print(f"{name:6s} forward {k_f:5d} kernels {t_f / k_f * 1e6:6.2f} us a kernel, backward "
              f"{k_b:5d} kernels {t_b / k_b * 1e6:6.2f} us, step {step * 1e6:6.2f} us a kernel")
    return 0


FIT, CHECK = ("bert", "gpt2", "llama"), ("t5", "vit")


def by_module() -> int:
    """The `--modules` fit (module docstring)."""
    import numpy as np
    torch.set_num_threads(1)
    ids = torch.randint(0, 256, (1, 8))
    names = FIT + CHECK
    models = {n: _tiny(n) for n in names}
    counts = {}
    for n, m in models.items():
        m.zero_grad(set_to_none=True)
        counts[n] = _counts(_loss(m, ids))
    runs = {n: [] for n in names}
    view_s = float("inf")
    for _ in range(ROUNDS):         # interleaved, the least of each: this CPU's speed wanders
        view_s = min(view_s, view_seconds(20))
        for n, model in models.items():
            runs[n].append(_fresh_step(model, ids)[:2])
    t_f = np.array([min(r[0] for r in runs[n]) for n in names])
    t_b = np.array([min(r[1] for r in runs[n]) for n in names])
    k_f, v_f, mods, k_b, v_b = (np.array(col, float) for col in zip(*(counts[n] for n in names)))
    fit = np.arange(len(FIT))
    net = t_f - v_f * view_s
    (a, c), *_ = np.linalg.lstsq(np.stack([k_f, mods], 1)[fit], net[fit], rcond=None)
    b = float(np.sum((k_b + v_b)[fit] * t_b[fit]) / np.sum((k_b + v_b)[fit] ** 2))
    (bk, bv), *_ = np.linalg.lstsq(np.stack([k_b, v_b], 1)[fit], t_b[fit], rcond=None)
    (a0,), *_ = np.linalg.lstsq(k_f[fit, None], net[fit], rcond=None)
    print(f"fitted on {', '.join(FIT)}; checked on {', '.join(CHECK)} "
          f"(view {view_s * 1e6:.2f} us)")
    print(f"forward: {a * 1e6:.2f} us a kernel + {c * 1e6:.2f} us a module entered: a module "
          f"costs {c / a:.2f} forward kernels")
    print(f"backward: {b * 1e6:.2f} us an op (kernel or view); apart {bk * 1e6:.2f} us a kernel, "
          f"{bv * 1e6:.2f} us a view")
    print("model   fwd kernels  views modules  measured  kernels+modules  kernels only"
          "   bwd ops  measured  per op")
    for i, n in enumerate(names):
        with_m, only = a * k_f[i] + c * mods[i] + v_f[i] * view_s, a0 * k_f[i] + v_f[i] * view_s
        print(f"{n:6s} {k_f[i]:12.0f} {v_f[i]:6.0f} {mods[i]:7.0f} {t_f[i] * 1e3:7.2f} ms "
              f"{(with_m / t_f[i] - 1) * 100:+14.1f}% {(only / t_f[i] - 1) * 100:+12.1f}% "
              f"{k_b[i] + v_b[i]:9.0f} {t_b[i] * 1e3:7.2f} ms "
              f"{(b * (k_b[i] + v_b[i]) / t_b[i] - 1) * 100:+6.1f}%")
    return 0


def _training(model, ids) -> tuple[float, float, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of one training step."""
    def forward():
        return model(input_ids=ids, labels=ids).loss

    def step():
        forward().backward()

    k_fwd, k_bwd = _kernels(forward)
    t_f = best(forward, 20)
    return t_f, best(step, 20) - t_f, k_fwd, k_bwd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated: bert, gpt2, llama, qwen2, t5, vit")
    ap.add_argument("--modules", action="store_true",
                    help="a module's host cost against a kernel's (module docstring)")
    args = ap.parse_args()
    if args.modules:
        return by_module()
    if args.models:
        return by_model(args.models.split(","))
    ids = torch.randint(0, 256, (1, 8))
    model = _model(False)
    t_f, t_b, k_f, k_b = _training(model, ids)
    f, b = t_f / k_f, t_b / k_b
    model.eval()

    def generate(n):
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    per_token = (best(lambda: generate(64), 5) - best(lambda: generate(16), 5)) / 48
    dec = Count(MODEL_VIEWS)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with dec:
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    ck_f, ck_b, ck_kf, ck_kb = _training(_model(True), ids)
    rerun = ck_kb - k_b
    extra = ck_f + ck_b - ck_kf * f - k_b * b
    rows = (("training forward", t_f, k_f), ("backward", t_b, k_b),
            ("decode step (generate)", per_token, dec.kernels),
            ("checkpointed forward", ck_f, ck_kf), ("checkpointed backward", ck_b, ck_kb))
    for name, seconds, kernels in rows:
        print(f"{name:23s} {seconds * 1e3:6.2f} ms {kernels:5d} kernels  "
              f"{seconds / kernels * 1e6:6.2f} us a kernel ({seconds / kernels / f:.2f} of a "
              f"forward kernel)")
    print(f"rerun kernels {rerun}: the checkpointed step's host beyond its forward and backward "
          f"kernels {extra * 1e3:.2f} ms, {extra / rerun * 1e6:.1f} us a rerun kernel "
          f"({extra / rerun / f:.2f} of a forward kernel); the checkpoint's own work "
          f"{(extra / rerun - f) * 1e6:.1f} us a rerun kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
