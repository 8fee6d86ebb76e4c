"""The plan as typed values: everything `trainplan plan` computed, before any formatting.

This is the contract the reports (text, Markdown, HTML, JSON) read. Field names are stable and
carry their unit: `_bytes`, `_s` (seconds), `_usd`; counts are plain ints. Nothing here is
formatted; `units.py` and `report/` do that. `Plan.to_json()` is the JSON form (`schema_version`
changes only when a key is removed or changes meaning).

Verdicts (one per platform):

    READY               runs as the job is written (same micro-batch, strategy and settings)
    READY WITH CHANGES  runs after the changes listed in `changes` (micro-batch split,
                        DDP over the platform's devices, rungs of the fix ladder)
    TIGHT               fits on paper, but not with the verdict's error band (the 95th
                        percentile of the memory error on validated runs like it,
                        predict/bands.py): prone to out-of-memory errors; `headroom` lists the
                        rungs that would give room without changing what is trained
    WON'T FIT           no rung of the fix ladder makes it fit (or the host, disk or session
                        cannot hold it); `reason` says what is missing
    RETIRED             the offering no longer exists (`retired_on` / `status_as_of`); planned for
                        reference only, never ranked first
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

SCHEMA_VERSION = "1.5"   # 1.1: max_micro_batch_size, required_bytes, *_label, calibration
                         # 1.2: verdict TIGHT, fit_margin, headroom
                         # 1.3: step_phases_s; campaign (per platform and the plan's)
                         # 1.4: fit_band, fit_probability, max_micro_batch_size_with_band;
                         #      fixes[]: fit_state, cost, *_alone, user_change, source
                         # 1.5: job.max_grad_norm
READY = "READY"
READY_WITH_CHANGES = "READY WITH CHANGES"
TIGHT = "TIGHT"
WONT_FIT = "WON'T FIT"
RETIRED = "RETIRED"
VERDICTS = (READY, READY_WITH_CHANGES, TIGHT, WONT_FIT, RETIRED)
OPTIMIZE = ("time", "cost", "balanced")


@dataclass(frozen=True)
class Fix:
    """One rung of the fix ladder, applied on top of the rungs before it, and what re-planning
    the job with it gave. `setting` is the job change (`{"grad_checkpointing": "selective"}`);
    the `_after` figures are the re-planned micro-batch, memory and step time; the `_before`
    figures those of the previous rung (or of the job as planned before the ladder). The
    `_alone` figures are the rung applied alone to the job as it came to the ladder, at its
    micro-batch: what this rung saves by itself. `fit_state` / `fit_state_alone`: fits, tight
    or does not fit (predict/memory.py). `cost`, `user_change`, `source`: the rung's row of
    data/fix_ladder.json."""

    rung: str                      # the rung id (fixes.py): "checkpointing-full", "zero3"
    title: str                     # "selective activation checkpointing"
    setting: dict
    fits: bool
    micro_batch_size: int | None
    grad_accum: int | None
    device_used_bytes_before: int | None
    device_used_bytes_after: int | None
    step_time_s_before: float | None
    step_time_s_after: float | None
    changes_training: bool         # LoRA, QLoRA, shorter sequences: a different training run
    note: str = ""
    fit_state: str = ""
    cost: str = ""                 # flag | optimizer | training | data | launcher | ...
    device_used_bytes_alone: int | None = None
    saved_bytes_alone: int | None = None
    fit_state_alone: str = ""
    step_time_s_alone: float | None = None
    user_change: str = ""
    source: str = ""


@dataclass(frozen=True)
class Sessions:
    """How the run is cut into sessions and weeks of quota (see plan/sessions.py for formulas)."""

    session_max_s: float | None          # None: no session limit (local, cloud)
    overhead_s_per_session: float        # start-up + resume + compile, paid by every session
    compile_s_per_session: float         # the XLA part of the overhead (TPU), else 0
    usable_s_per_session: float | None   # session_max_s - overhead
    sessions: int
    checkpoint_every_s: float            # save cadence: the most work a disconnect can lose
    checkpoint_every_steps: int
    idle_timeout_s: float | None
    background_execution: bool           # False: the browser tab must stay open and active
    accelerator_s: float                 # training + overheads: what a quota is charged
    weekly_quota_s: float | None
    quota_weeks: float | None            # accelerator_s / weekly_quota_s
    calendar_weeks: int | None           # weeks of quota the run spans (ceil of quota_weeks)
    finish_s: float                      # wall clock from the first session to the last step


@dataclass(frozen=True)
class Storage:
    """Checkpoint size and how many the platform's output disk and file limit hold."""

    checkpoint_bytes: int
    weights_bytes: int                   # what the checkpoint stores of the model
    optimizer_state_bytes: int
    adapter_only: bool                   # LoRA: only the adapters and their optimizer state
    files_per_checkpoint: int
    disk_bytes: int | None
    output_file_limit: int | None
    checkpoints_fit_disk: int | None     # None: no limit known
    checkpoints_fit_files: int | None


@dataclass(frozen=True)
class Cost:
    """Dollars for the run (see plan/cost.py). Free tiers and owned hardware cost 0."""

    usd_per_hour: float
    accelerator_hours: float
    compute_usd: float
    subscription_usd: float
    total_usd: float
    compute_units: float | None          # Colab compute units the run burns
    months: int                          # subscription months the run spans (0 if none)


@dataclass(frozen=True)
class AsGiven:
    """The job as written on one platform, known after a plan's first round of traces, before
    any fix-ladder rung is traced (plan/build.py `make_plan`'s `answered`): what a plan can say
    first."""

    platform_id: str
    micro_batch: int
    fit_state: str                       # fits / tight / does not fit (predict/memory.py)
    step_time_s: float
    required_bytes: int
    capacity_bytes: int


@dataclass(frozen=True)
class Crossover:
    """Owned hardware against another platform: from `runs` runs on (None: not within
    MAX_CROSSOVER_RUNS) the owned machine's dollars are no more than the other's."""

    platform_id: str
    runs: int | None


@dataclass(frozen=True)
class Campaign:
    """Many runs of the job on one platform (see plan/campaign.py for the formulas)."""

    runs: int
    accelerator_s: float                 # all runs, session overheads included
    sessions: int
    calendar_s: float                    # first session to last step, quota waits included
    runs_per_week: float | None          # runs a weekly quota holds (None: no quota)
    quota_binds: bool                    # the campaign waits for weekly quota resets
    within_period: bool | None           # the runs fit the stated period (None: no period)
    compute_usd: float                   # cloud hours or compute units beyond the subscription
    subscription_usd: float              # months of the campaign's span (or its period)
    hardware_usd: float                  # owned: purchase price x span / lifetime (at most 1x)
    electricity_usd: float               # owned: board power x hours x price per kWh
    energy_kwh: float
    total_usd: float                     # compute + subscription + hardware + electricity
    waiting_usd: float                   # calendar hours x the value of waiting time
    owned: bool
    crossovers: tuple[Crossover, ...] = ()
    cost_by_runs: tuple[tuple[int, float], ...] = ()   # (runs, total_usd): the cumulative cost


@dataclass(frozen=True)
class CheckItem:
    """One line of a platform's checklist: status pass | fail | warn | info."""

    status: str
    text: str


@dataclass(frozen=True)
class PlatformPlan:
    """The job planned on one platform."""

    platform_id: str
    name: str
    provider: str
    accelerator_id: str
    accelerator_count: int
    devices: int
    status: str                          # catalog status: current | retired | unavailable
    retired_on: str | None
    verdict: str
    fits: bool
    strategy: str
    strategy_label: str                  # what the strategy means ("DeepSpeed ZeRO-3 (...)")
    precision: str
    precision_label: str                 # what was planned: "fp16 mixed precision (AMP ...)"
    micro_batch_size: int | None
    grad_accum: int | None
    max_micro_batch_size: int | None     # largest that fits, with this accumulation (estimate's)
    global_batch_size: int | None
    device_used_bytes: int | None        # per device, what nvidia-smi shows
    required_bytes: int | None           # the least device memory the step runs in (fit test)
    capacity_bytes: int
    fit_margin: float | None             # fraction of capacity the device leaves free (memory.py)
    peak_phase: str | None
    memory_breakdown_bytes: dict
    host_ram_bytes: int | None           # host memory the job needs (processes, offload, workers)
    platform_ram_bytes: int | None
    step_time_s: float | None            # one optimizer step (all micro-batches)
    step_phases_s: dict | None           # its phases (generation, reference, training...)
    samples_per_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    bound: str | None
    steps: int | None
    train_s: float | None                # steps x step_time_s, no overheads
    sessions: Sessions | None
    storage: Storage | None
    cost: Cost | None
    changes: tuple[str, ...]             # what the user changes for this platform, in order
    fixes: tuple[Fix, ...]               # the ladder rungs tried, with their effects
    skipped_fixes: tuple[str, ...]       # rungs this platform cannot do, and why
    checklist: tuple[CheckItem, ...]
    findings: tuple[dict, ...]           # {severity, kind, message, fix} (predict/findings.py)
    within_budget: bool | None
    meets_deadline: bool | None
    interpolated: bool                   # figures interpolated between two traced batches
    calibration: dict = field(default_factory=dict)   # what the step time rests on
    headroom: tuple[str, ...] = ()       # TIGHT: rungs that give room without changing training
    fit_band: dict | None = None         # the verdict's error band (predict/bands.py)
    fit_probability: float | None = None  # share of the band's validated runs that would fit
    max_micro_batch_size_with_band: int | None = None   # largest that fits with the band
    campaign: Campaign | None = None     # many runs (plan --runs, a campaign: block)
    rank: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class JobSummary:
    model: str
    name: str
    params_total: int | None
    params_trainable: int | None
    precision: str
    precision_label: str
    optimizer: str
    strategy: str
    batch_size: int
    grad_accum: int
    seq_len: int | None
    image_size: int | None
    lora_rank: int | None
    quantize: str
    grad_checkpointing: str
    max_grad_norm: float | None = None   # gradient clipping (None: none)


@dataclass(frozen=True)
class Plan:
    """A job planned over platforms, ranked (`platforms` is in rank order)."""

    job: JobSummary
    steps: int
    steps_source: str                    # "steps" | "epochs x dataset_size / global batch"
    epochs: float | None
    dataset_size: int | None
    target_batch: int
    optimize: str
    budget_usd: float | None
    deadline_s: float | None
    platforms: tuple[PlatformPlan, ...]
    winner: str | None
    recommendation: str
    assumptions: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    campaign: dict | None = None         # the campaign asked for: runs, period, sweep, prices
    schema_version: str = SCHEMA_VERSION

    def platform(self, platform_id: str) -> PlatformPlan:
        for p in self.platforms:
            if p.platform_id == platform_id:
                return p
        raise KeyError(platform_id)

    def to_json(self) -> dict:
        """Plain JSON types only (tuples become lists); keys as the field names above."""
        out = plain(self)
        return {"schema_version": out.pop("schema_version"), **out}


def plain(x):
    """A dataclass (or a dict, list or tuple of them) as plain JSON containers: each dataclass a
    dict of its fields, each tuple or list a list, each dict a dict; anything else as it is.
    What `dataclasses.asdict` then tuples as lists gives, in one pass and without copying the
    values it reaches (asdict deep-copies each): the JSON of Llama-3.1-70B's plan over every
    platform in 0.026-0.028 s against 0.047-0.059 s (2 cores, 2026-12-03). The one home of
    this conversion: the plan's JSON, the report's extras and an export's plan_json."""
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in fields(x)}
    return x
