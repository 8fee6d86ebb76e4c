"""The fix ladder (plan/fixes.py): cheapest rung first, effects re-planned, and never a rung the
platform cannot do."""
import pytest

from conftest import tiny_job
from trainplan.accelerators import get_accelerator
from trainplan.plan import make_plan, select_platforms
from trainplan.plan import fixes
from trainplan.plan.fixes import Skip, Step
from trainplan.errors import TrainplanError
from trainplan.precision import FP16, FP16_AMP
from trainplan.predict import compat
from trainplan.spec import Lora
from trainplan.strategy import ZERO3

T4, A100, V5E = (get_accelerator(a) for a in ("t4", "a100-sxm4-40gb", "tpu-v5e-8"))


def test_mixed_precision_rung_picks_what_the_device_supports():
    job = tiny_job(precision="fp32")
    assert fixes.precision(job, T4, 1).job.precision == "fp16-amp"       # no bf16 on sm75
    assert fixes.precision(job, A100, 1).job.precision == "bf16-amp"
    assert fixes.precision(job, V5E, 8).job.precision == "bf16-amp"
    assert fixes.precision(tiny_job(precision="fp16-amp"), T4, 1) is None  # already 16-bit


def test_bf16_job_on_a_t4_becomes_fp16_before_anything_else():
    job, changes = compat.adapt(tiny_job(precision="bf16-amp"), T4)
    assert job.precision is FP16_AMP and "no bf16" in changes[0]
    job, changes = compat.adapt(tiny_job(precision="bf16"), T4)        # pure stays pure
    assert job.precision is FP16
    job, changes = compat.adapt(tiny_job(precision="bf16-amp"), A100)
    assert job.precision == "bf16-amp" and changes == []


def test_cuda_only_rungs_are_refused_on_a_tpu_with_the_reason():
    """The rungs propose; the one compatibility table (predict/compat.py) says what the target
    cannot run, with the same message `estimate` gives."""
    job = tiny_job(model="hf:openai-community/gpt2", transformer=None, lora=Lora(rank=4),
                   gpus=1)
    for rung in (fixes.optimizer_8bit, fixes.qlora, fixes._offload("optimizer")):
        r = rung(job, V5E, 8)
        assert isinstance(r, Step), r
        broken = compat.violation(r.job, V5E)
        assert broken is not None and ("CUDA" in broken.message or "DeepSpeed" in broken.message)
        with pytest.raises(TrainplanError, match=broken.message.split(" (")[0][:20]):
            compat.check(r.job, V5E)
    one = fixes._sharding(ZERO3)(job, A100, 1)
    assert compat.violation(one.job, A100).message.endswith("on one device shards nothing.")
    two = fixes._sharding(ZERO3)(job.with_(gpus=2), A100, 2)
    assert isinstance(two, Step) and compat.violation(two.job, A100) is None


def test_lora_only_for_pretrained_models():
    r = fixes.lora(tiny_job(), A100, 1)
    assert isinstance(r, Skip) and "from scratch" in r.reason
    r = fixes.lora(tiny_job(model="hf:openai-community/gpt2", transformer=None), A100, 1)
    assert isinstance(r, Step) and r.changes_training and r.job.lora is not None


def test_eager_attention_that_does_not_fit_is_fixed_by_the_first_rung():
    # 8192 tokens of eager fp32 attention: the 8192^2 score matrices alone exceed a 4 GB laptop
    # GPU at micro-batch 1; SDPA (flash on sm86) does not materialise them.
    job = tiny_job(seq_len=8192, batch_size=1, attention="eager", steps=10)
    plan = make_plan(job, select_platforms(["local-rtx-3050-laptop-4gb"]))
    p = plan.platforms[0]
    assert p.verdict == "READY WITH CHANGES" and p.fits
    assert p.fixes[0].rung == "attention" and p.fixes[0].fits
    assert p.fixes[0].device_used_bytes_after < p.fixes[0].device_used_bytes_before
    assert p.fixes[0].device_used_bytes_before > p.capacity_bytes
    assert any("memory-efficient attention" in c for c in p.changes)
    assert len(p.fixes) == 1                                             # stops once it fits
    assert any(s.startswith("lora:") for s in p.skipped_fixes) is False  # never reached


def test_a_missed_deadline_tries_the_speed_rungs_and_says_so():
    # fp32 matmuls on an RTX 3090 run at 35.6 TFLOP/s, bf16 at 71: mixed precision is faster.
    # A 1-second deadline cannot be met; the plan keeps the rung that helps and ranks it below.
    from trainplan.models.reference import TransformerDims
    job = tiny_job(precision="fp32", steps=1000, batch_size=8, seq_len=512,
                   transformer=TransformerDims(hidden_size=1024, num_layers=2, num_heads=8,
                                               intermediate_size=4096, vocab_size=256))
    plan = make_plan(job, select_platforms(["local-rtx-3090"]), deadline_s=1.0)
    p = plan.platforms[0]
    assert p.meets_deadline is False and "misses the deadline" in p.reason
    assert plan.winner is None and "none within the limits" in plan.recommendation
    speed = [f for f in p.fixes if f.rung == "precision"]
    assert speed and speed[0].setting == {"precision": "bf16-amp"}
    assert speed[0].step_time_s_after < speed[0].step_time_s_before
    assert p.precision == "bf16-amp" and any("mixed precision" in c for c in p.changes)


def test_shorter_sequences_are_not_tried_where_what_no_length_changes_does_not_fit():
    """A 1.6B-parameter model from scratch in fp32 on a TPU v5e (16 GiB a core; no 8-bit
    optimizer, LoRA, sharding or offload there): its weights, AdamW states and gradients need
    more than a core has at any length, so the ladder says so once instead of tracing three
    halvings; and the bound holds: the job at an eighth of its length still needs more than it."""
    from trainplan.models.reference import TransformerDims
    from trainplan.predict import Traces, evaluate
    dims = TransformerDims(hidden_size=8192, num_layers=2, num_heads=8, intermediate_size=32768,
                           vocab_size=256)
    job = tiny_job(seq_len=1024, batch_size=1, steps=10, transformer=dims)
    plan = make_plan(job, select_platforms(["kaggle-tpu-v5e-8"]))
    p = plan.platforms[0]
    assert not p.fits
    seq = [f for f in p.fixes if f.rung == "seq-len"]
    assert len(seq) == 1 and not seq[0].fits and seq[0].device_used_bytes_after is None
    assert "no shorter sequence fits; not tried" in seq[0].note
    tpu = get_accelerator("tpu-v5e-8")
    full = evaluate(job, tpu, traces=Traces()).memory
    short = evaluate(job.with_(seq_len=128), tpu, traces=Traces()).memory
    assert full.floor_bytes > full.capacity_bytes
    assert short.floor_bytes == full.floor_bytes and short.required_bytes >= short.floor_bytes
    assert not short.fits


def _with_capacity(platform, capacity: int):
    """`platform` with its accelerator's usable memory set to `capacity` bytes."""
    import dataclasses
    accel = dataclasses.replace(platform.accelerator, usable_memory_bytes=int(capacity))

    class Sized(type(platform)):
        @property
        def accelerator(self):
            return accel
    return Sized(**{f.name: getattr(platform, f.name) for f in dataclasses.fields(platform)})


def test_an_optimizer_rung_that_could_make_the_step_fit_is_tried():
    """An 8-bit optimizer frees at most 3/4 of the trace's optimizer state (planner.py
    `_at_most_saves`): under 64 MiB for LoRA adapters, too little to keep for its own sake. A
    step that much over the device is still tried with it, and fits, before the LoRA rank is
    halved (which changes what is trained); where freeing all of it would leave the step over
    the device, it is reported untried."""
    from trainplan.plan.planner import KEEP_MIN_BYTES, Planner
    from trainplan.predict import Traces
    job = tiny_job(precision="bf16", steps=10,
                   lora=Lora(rank=64, alpha=128.0, targets="all-linear", dropout=0.0))
    t4, traces = select_platforms(["kaggle-t4x2"])[0], Traces()

    def plan_on(platform):       # a planner per capacity (it keeps evaluations by accelerator)
        return make_plan(job, [platform], planner=Planner(job, traces)).platforms[0]
    row = plan_on(t4)
    state = row.storage.optimizer_state_bytes
    assert row.fits and 0.75 * state < KEEP_MIN_BYTES
    need = row.required_bytes
    near = plan_on(_with_capacity(t4, need - 0.1 * state))
    eight = [f for f in near.fixes if f.rung == "optimizer-8bit"]
    assert eight and eight[0].fits and eight[0].device_used_bytes_after < need
    assert near.fits and [f.rung for f in near.fixes if not f.note][0] == "optimizer-8bit"
    assert not any(f.rung == "lora-smaller" for f in near.fixes)      # the rank stays 64
    far = plan_on(_with_capacity(t4, need - 4 * state))
    untried = [f for f in far.fixes if f.rung == "optimizer-8bit"]
    assert untried and untried[0].device_used_bytes_after is None
    assert untried[0].note.endswith("not tried")


def test_the_headroom_climb_leaves_out_the_rungs_that_change_training():
    """plan/build.py `_headroom`: a tight job is given room only by rungs that keep what is
    trained, so a rung that changes it (half the sequence) is not climbed, and not traced; the
    plain ladder climbs it."""
    from trainplan.plan.planner import Planner
    from trainplan.predict import Traces
    job = tiny_job(seq_len=256, steps=10, grad_checkpointing="full")
    a100 = select_platforms(["lambda-gpu-1x-a100"])[0]
    traces = Traces()
    planner = Planner(job, traces)
    cfg = planner.configure(job, a100)
    rungs = (fixes.seq_len, fixes.optimizer_8bit)
    _jv, _cfg, tried, _skipped = planner.ladder(job, a100, cfg, rungs=rungs,
                                                need=lambda c: False, same_training=True)
    assert [f.rung for f in tried] == ["optimizer-8bit"]
    assert not any("seq_len=128" in key[0] for key in traces._exact)
    _jv, _cfg, tried, _skipped = planner.ladder(job, a100, cfg, rungs=rungs,
                                                need=lambda c: False)
    assert [f.rung for f in tried][0] == "seq-len" and tried[0].changes_training
    assert any("seq_len=128" in key[0] for key in traces._exact)


def test_offload_runs_deepspeeds_cpu_adam_not_a_bitsandbytes_optimizer():
    """ZeRO-Offload steps on the CPU with DeepSpeedCPUAdam: accelerate (and the HF Trainer) puts
    it in place of a bitsandbytes 8-bit or paged AdamW, whose kernels do not run on the CPU, and
    DeepSpeed alone refuses one. The offload rung on top of an 8-bit AdamW kept by an earlier
    rung takes AdamW, and a job written with both is rewritten to it, with the reason."""
    from trainplan.optimizer import ADAMW
    job = tiny_job(model="hf:openai-community/gpt2", transformer=None, gpus=2,
                   optimizer="adamw-8bit")
    for level in ("optimizer", "optimizer+params"):
        r = fixes._offload(level)(job, A100, 2)
        assert r.job.optimizer is ADAMW and "AdamW on the CPU in place of" in r.title
        assert compat.violation(r.job, A100) is None
    plain = fixes._offload("optimizer")(job.with_(optimizer="adamw"), A100, 2)
    assert plain.job.optimizer is ADAMW and "in place of" not in plain.title
    both = job.with_(offload="optimizer", strategy="zero2")
    assert "DeepSpeed's CPU Adam" in compat.violation(both, A100).message
    ran, changes = compat.adapt(both, A100)
    assert ran.optimizer is ADAMW and changes[0].startswith("optimizer adamw instead of")


def test_offload_warns_where_accelerate_puts_cpu_adam_in_place_of_the_optimizer():
    """accelerate (utils/deepspeed.py `map_pytorch_optim_to_deepspeed`) maps the script's
    optimizer under offload to DeepSpeed's CPU Adam unless it is Adam/AdamW, Adagrad or Lion:
    SGD or Adafactor so written is warned about (not rewritten: it would change the algorithm);
    without offload, or with AdamW or Lion, nothing is said."""
    job = tiny_job(model="hf:openai-community/gpt2", transformer=None, gpus=2,
                   offload="optimizer", strategy="zero2")
    for name in ("sgd", "sgd-momentum", "adafactor"):
        found = [f for f in compat.check(job.with_(optimizer=name), A100)
                 if "in place of" in f.message]
        assert len(found) == 1 and found[0].severity == "warning", name
        assert "zero_force_ds_cpu_optimizer" in found[0].fix
        assert compat.adapt(job.with_(optimizer=name), A100)[0].optimizer.name == name
    for quiet in (job.with_(optimizer="adamw"), job.with_(optimizer="lion"),
                  job.with_(optimizer="sgd", offload="none", strategy="ddp")):
        assert not [f for f in compat.check(quiet, A100) if "in place of" in f.message]
