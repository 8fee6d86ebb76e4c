"""The caching allocator with expandable segments (trace/derive/expandable.py): its rules on
hand-worked sequences, its replay of a real trace against the default allocator's, and the job
option end to end."""
import json

import pytest

from conftest import tiny_job, trace
from plan_examples import run_cli
from trainplan.trace.derive.allocator import CUDA, CUDA_EXPANDABLE, replay, replay_within, rules_for

MiB = 2**20


def test_a_freed_block_at_the_end_grows_into_the_next_request():
    """30 MiB maps two 20 MiB pages; freed, the 40 MiB free block before the unmapped space takes
    a 50 MiB request with one page more (60 MiB reserved), where the default allocator keeps the
    30 MiB segment and cudaMallocs a 50 MiB one (80 MiB)."""
    ev = [(1, 30 * MiB), (1, -1), (2, 50 * MiB)]
    assert replay(ev, CUDA) == (50 * MiB, 80 * MiB, 50 * MiB)
    # pinned: the 50 MiB block spans all three pages, none of them wholly free
    assert replay(ev, CUDA_EXPANDABLE) == (50 * MiB, 60 * MiB, 60 * MiB)


def test_large_blocks_split_down_to_512_bytes():
    """A 25.5 MiB request in a free 26 MiB block: the default allocator splits a large block only
    when more than 1 MiB is left, so the whole 26 MiB counts as allocated; with expandable
    segments any block splits when 512 bytes are left (should_split)."""
    ev = [(1, 25 * MiB), (1, -1), (2, 25 * MiB + MiB // 2)]
    assert replay(ev, CUDA)[0] == 26 * MiB
    assert replay(ev, CUDA_EXPANDABLE)[0] == 25 * MiB + MiB // 2


def test_best_fit_keeps_off_the_growing_end():
    """Free: 17 MiB at the end of the mapped range, 30 MiB in the middle. A 16 MiB request fits
    both; the end block counts as what it could grow to, so the middle one is taken and a 17 MiB
    request after it still fits the end without mapping (60 MiB reserved). Best fit by size alone
    would put 16 MiB at the end and map a page for the 17 MiB."""
    ev = [(1, 30 * MiB), (2, 8 * MiB), (3, 5 * MiB),   # A [0,30) B [30,38) C [38,43); 60 mapped
          (1, -1),                                      # free [0,30) and [43,60)
          (4, 16 * MiB), (5, 17 * MiB)]
    assert replay(ev, CUDA_EXPANDABLE)[1] == 60 * MiB


def test_release_unmaps_whole_free_pages_and_retries():
    """At a limit, the mapping that would pass it is undone: every page wholly inside a free
    block is unmapped and the request placed again."""
    ev = [(1, 30 * MiB), (2, 30 * MiB), (1, -1), (3, 35 * MiB)]
    # unconstrained: A [0,30) B [30,60) on 60 MiB; A freed; 35 MiB does not fit the 30 MiB hole
    # and grows the end: 100 MiB mapped
    assert replay(ev, CUDA_EXPANDABLE)[1] == 100 * MiB
    # within 80 MiB: the hole's one whole page [0,20) is unmapped (40 MiB mapped) and the
    # request maps two pages at the end (80 MiB)
    assert replay_within(ev, 80 * MiB, CUDA_EXPANDABLE) == (100 * MiB - 20 * MiB, False)
    assert replay_within(ev, 70 * MiB, CUDA_EXPANDABLE)[1] is True


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_a_traced_step_reserves_no_more_than_the_default_allocator(kind):
    tr = trace(tiny_job(kind=kind, batch_size=4, seq_len=64))
    alloc, reserved, pinned = replay(tr.log.events, CUDA)
    e_alloc, e_reserved, e_pinned = replay(tr.log.events, CUDA_EXPANDABLE)
    assert e_alloc <= alloc and e_alloc <= e_pinned <= e_reserved
    # pages are 2 MiB (small pool) and 20 MiB (large): what it holds beyond the allocated peak
    # is at most a page of each pool past what the default allocator holds beyond its own
    assert e_reserved <= reserved + 22 * MiB
    reserved_within, oom = replay_within(tr.log.events, e_pinned + 2 * MiB, CUDA_EXPANDABLE)
    assert not oom and reserved_within <= e_pinned + 2 * MiB


def test_only_cuda_honours_the_setting():
    assert rules_for("cuda", True) is CUDA_EXPANDABLE and rules_for("cuda") is CUDA
    assert rules_for("rocm", True) is CUDA and rules_for("mps", True).name == "mps"


def test_estimate_with_expandable_segments(capsys):
    """torchtitan's Llama 3.1 8B FSDP step on 8 GPUs, cut to a reference model small enough to
    trace here: the job option replays the expandable allocator, says so, and holds less."""
    argv = ["estimate", "--model", "hf:meta-llama/Llama-3.2-1B", "--gpu", "h100-sxm",
            "--gpus", "8", "--strategy", "fsdp", "--precision", "bf16-amp", "--batch-size", "2",
            "--seq-len", "1024", "--grad-checkpointing", "selective"]
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    default = json.loads(out)["per_device"]
    code, out, _ = run_cli(capsys, *argv, "--expandable-segments", "--format", "json")
    assert code == 0
    grown = json.loads(out)["per_device"]
    assert (default["allocator"], grown["allocator"]) == ("cuda", "cuda-expandable")
    assert grown["peak_allocated_bytes"] <= default["peak_allocated_bytes"]
    assert grown["peak_reserved_bytes"] < default["peak_reserved_bytes"]
    code, out, _ = run_cli(capsys, *argv, "--expandable-segments")
    assert "allocator: expandable segments" in out


def test_elsewhere_the_setting_is_named_and_ignored(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "hf:openai-community/gpt2",
                           "--gpu", "m3-max-128gb", "--batch-size", "2", "--seq-len", "256",
                           "--expandable-segments", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["per_device"]["allocator"] == "mps"
    assert any("expandable segments are a setting of CUDA" in f["message"]
               for f in doc["findings"])


def test_a_job_file_value_that_is_not_true_or_false_is_refused(tmp_path, capsys):
    f = tmp_path / "job.yaml"
    f.write_text("model: hf:openai-community/gpt2\nseq_len: 128\nexpandable_segments: yes please\n")
    code, out, err = run_cli(capsys, "estimate", str(f), "--gpu", "t4")
    assert code == 2 and "expandable_segments" in err and "true or false" in err


def test_the_launch_sets_the_allocator_the_plan_assumed(tmp_path):
    """A plan made with expandable segments exports the environment it was made with; a plan on
    a backend without them (or without the setting) sets nothing."""
    from trainplan.export import launch_from_plan, render
    from trainplan.plan import make_plan
    from trainplan.platforms import platforms_with
    job = tiny_job(steps=50, precision="bf16-amp", expandable_segments=True)
    for accel, want in (("h100-sxm", True), ("mi300x", False)):
        plan = make_plan(job, platforms_with(accel, 1))
        pp = plan.platforms[0]
        ln = launch_from_plan(plan, pp, job)
        script = render(ln, "torchrun")["torchrun.sh"]
        assert ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in script) is want
    job = job.with_(expandable_segments=False)
    plan = make_plan(job, platforms_with("h100-sxm", 1))
    ln = launch_from_plan(plan, plan.platforms[0], job)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in ln.env()


def test_estimate_advises_expandable_segments_where_they_change_the_verdict():
    """torchtitan's Llama 3.1 8B step (FSDP on 8 H100, selective checkpointing, 2 x 8192
    tokens) does not fit the H100's 79.65 GiB with the default allocator's cache; with the
    expandable segments torchtitan launches with it fits on paper, and `estimate` says so. A job
    that fits, or that asks for them already, gets no such advice."""
    from trainplan.accelerators import get_accelerator
    from trainplan.estimate import estimate
    from trainplan.spec import Job, validate
    job = validate(Job(model="hf:meta-llama/Llama-3.1-8B", batch_size=2, seq_len=8192,
                       precision="bf16-amp", grad_checkpointing="selective", strategy="fsdp",
                       gpus=8))
    h100 = get_accelerator("h100-sxm")
    est = estimate(job, h100, with_max_batch=False)
    advice = [f for f in est.findings if "expandable" in f.message]
    assert est.fit_state == "does not fit" and len(advice) == 1
    assert "fits on paper" in advice[0].message and advice[0].kind == "advice"
    grown = estimate(job.with_(expandable_segments=True), h100, with_max_batch=False)
    assert grown.fit_state != "does not fit"
    assert not [f for f in grown.findings if "expandable allocator" in f.message]
    small = estimate(job.with_(batch_size=1), h100, with_max_batch=False)
    assert small.fit_state == "fits" and not [f for f in small.findings
                                               if "expandable" in f.message]
