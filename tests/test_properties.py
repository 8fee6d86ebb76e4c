"""Property tests on a tiny model: more batch never lowers the peak; checkpointing never raises it."""
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shallow, tiny_job, trace


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 6), kind=st.sampled_from(["encoder", "decoder"]),
       precision=st.sampled_from(["fp32", "fp16"]))
def test_larger_batch_never_lowers_the_peak(batch, kind, precision):
    small = trace(tiny_job(kind=kind, precision=precision), batch=batch)
    big = trace(tiny_job(kind=kind, precision=precision), batch=batch + 1)
    assert big.peak_allocated_bytes >= small.peak_allocated_bytes
    assert big.activation_bytes >= small.activation_bytes


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 8), mode=st.sampled_from(["full", "selective"]),
       kind=st.sampled_from(["encoder", "decoder"]), seq=st.sampled_from([32, 256]))
def test_checkpointing_never_raises_the_peak(batch, mode, kind, seq):
    base = trace(tiny_job(kind=kind, seq_len=seq, num_layers=6), batch=batch)
    ck = trace(tiny_job(kind=kind, seq_len=seq, num_layers=6, grad_checkpointing=mode),
               batch=batch)
    assert ck.activation_bytes <= base.activation_bytes
    assert ck.peak_allocated_bytes <= base.peak_allocated_bytes


def test_full_checkpointing_lowers_the_peak_of_gpt2():
    """The peak property on a real model, whose blocks transformers' KV cache would otherwise
    make differ between forward and recomputation (the tracer turns the cache off, as
    transformers' own gradient checkpointing does)."""
    from trainplan.spec import Job, validate
    job = validate(Job(model="hf:openai-community/gpt2", batch_size=4, seq_len=512))
    base = trace(job)
    ck = trace(job.with_(grad_checkpointing="full"))
    assert ck.peak_allocated_bytes < base.peak_allocated_bytes
    assert ck.activation_bytes < base.activation_bytes / 3


def test_selective_checkpointing_sits_between_none_and_full_on_llama():
    """Llama-3.2-1B's blocks, 4 of its 16 (conftest.py `shallow`): each block saves less under
    selective checkpointing than without, more than under full."""
    from trainplan.spec import Job, validate
    job = validate(Job(model=shallow("meta-llama/Llama-3.2-1B", 4), batch_size=1, seq_len=512,
                       precision="bf16-amp"))
    acts = {m: trace(job.with_(grad_checkpointing=m), autocast=__import__("torch").bfloat16)
            .activation_bytes for m in ("none", "selective", "full")}
    assert acts["full"] < acts["selective"] < acts["none"]
