"""Platform catalog: where a job can run, with limits and prices (`data/platforms.csv`).

A platform is one offering: a free notebook tier (Kaggle GPU T4 x2), a paid notebook tier
priced in compute units (Colab Pro A100), a cloud instance (AWS p4d.24xlarge) or owned
hardware (local RTX 3090). Retired offerings stay in the catalog with their dates so a plan
can say "Kaggle P100 was retired on 2026-09-15" instead of "unknown platform".

Units: seconds, bytes, USD. An empty cell is None: for limits it means "no limit" (cloud,
local) or "not published" -- the row's `notes` says which. Every built-in row cites IDs in
`data/SOURCES.md` and has an `as_of` date.

Which platforms a command covers is chosen here too, from the catalog alone (no PyTorch, so a
misspelt id is answered at once): `select_platforms(ids)` for `--platforms` (retired ones
included, all current ones for none) and `platforms_with(gpu, gpus)` for `--gpu/--gpus` (a
platform built from the accelerator catalog where no row has that many).

Users add or override rows with a YAML file (`--platforms-file`): a list of mappings with the
same field names (or a mapping with a `platforms:` list). Required: id, name, accelerator_id,
accelerator_count, usd_per_hour. A user row whose id equals a built-in id replaces it.
Example::

    - id: lab-a6000x2
      name: Lab workstation
      accelerator_id: rtx-a6000
      accelerator_count: 2
      usd_per_hour: 0
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, fields
from datetime import date
from importlib import resources

import yaml

from .accelerators import Accelerator, get_accelerator
from .errors import TrainplanError, unknown

STATUSES = ("current", "retired", "unavailable")
QUOTA_KINDS = ("gpu", "tpu", "none")
USER_REQUIRED = ("id", "name", "accelerator_id", "accelerator_count", "usd_per_hour")
USER_DEFAULTS = {"provider": "user", "status": "current", "quota_kind": "none",
                 "background_execution": "yes", "sources": "user file"}


@dataclass(frozen=True)
class Platform:
    """One row of `platforms.csv` (or of a user platforms file).

    accelerator_id / accelerator_count: catalog accelerator and how many units (a TPU v5e-8
        host is 1 unit of 8 devices; Kaggle T4 x2 is 2 units). See `devices`.
    status: current | retired | unavailable, as known on `status_as_of`; `retired_on` when dated.
    session_max_s: longest single session (Kaggle GPU 12 h, TPU 9 h, S17). idle_timeout_s:
        interactive idle disconnect. weekly_quota_s + quota_kind: accelerator time per week and
        which pool it draws from (Kaggle GPU 30 h, S18; TPU 20 h, S19).
    ram_bytes, cpu_cores, disk_bytes: host resources; output_file_limit: max saved output files.
    usd_per_hour: marginal price of the whole offering per hour (0 for free tiers and owned
        hardware; Colab = compute_units_per_hour x usd_per_compute_unit). usd_per_month:
        subscription fee, if any. background_execution: runs survive closing the browser.
    """

    id: str
    provider: str
    name: str
    accelerator_id: str
    accelerator_count: int
    status: str
    status_as_of: str | None
    retired_on: str | None
    session_max_s: float | None
    idle_timeout_s: float | None
    weekly_quota_s: float | None
    quota_kind: str
    ram_bytes: int | None
    cpu_cores: int | None
    disk_bytes: int | None
    output_file_limit: int | None
    usd_per_hour: float
    usd_per_month: float | None
    compute_units_per_hour: float | None
    usd_per_compute_unit: float | None
    background_execution: bool
    notes: str
    sources: tuple[str, ...]
    as_of: str | None

    @property
    def accelerator(self) -> Accelerator:
        return get_accelerator(self.accelerator_id)

    @property
    def devices(self) -> int:
        """Devices the job is spread over: units x devices per unit (T4 x2 -> 2, v5e-8 -> 8)."""
        return self.accelerator_count * self.accelerator.devices_per_unit

    @property
    def is_current(self) -> bool:
        return self.status == "current"


FIELD_NAMES = tuple(f.name for f in fields(Platform))


def _int(v: str) -> int:
    x = float(v)
    if x != int(x):
        raise ValueError(f"expected a whole number, got {v!r}")
    return int(x)


def _bool(v: str) -> bool:
    if str(v).lower() not in ("yes", "no", "true", "false"):
        raise ValueError(f"expected yes or no, got {v!r}")
    return str(v).lower() in ("yes", "true")


def _iso(v: str) -> str:
    return date.fromisoformat(str(v)).isoformat()


_PARSE = {
    "accelerator_count": _int, "ram_bytes": _int, "cpu_cores": _int, "disk_bytes": _int,
    "output_file_limit": _int, "background_execution": _bool,
    "status_as_of": _iso, "retired_on": _iso, "as_of": _iso,
    "sources": lambda v: tuple(s.strip() for s in str(v).split(";") if s.strip()),
    **{k: float for k in ("session_max_s", "idle_timeout_s", "weekly_quota_s", "usd_per_hour",
                          "usd_per_month", "compute_units_per_hour", "usd_per_compute_unit")},
}
_NON_NEGATIVE = ("session_max_s", "idle_timeout_s", "weekly_quota_s", "usd_per_hour", "usd_per_month",
                 "compute_units_per_hour", "usd_per_compute_unit", "ram_bytes", "cpu_cores", "disk_bytes")


def _build(raw: dict[str, str | None], where: dict[str, str], builtin: bool) -> Platform:
    """Parse and check one row. `where[field]` says where that field's value is ("file:line")."""
    row = dict(raw)
    if not builtin:
        for k, v in USER_DEFAULTS.items():
            row.setdefault(k, v)
    required = ("id", "provider", "name", "accelerator_id", "accelerator_count", "status",
                "quota_kind", "usd_per_hour", "sources") + (("as_of",) if builtin else USER_REQUIRED)
    for name in required:
        if row.get(name) in (None, ""):
            raise TrainplanError(f"{where['_row']}: platform is missing required field {name!r}.",
                                 allowed="required: " + ", ".join(dict.fromkeys(required)))
    values: dict[str, object] = {}
    for name in FIELD_NAMES:
        v = row.get(name)
        if v is None or v == "":
            values[name] = "" if name == "notes" else None
            continue
        try:
            values[name] = _PARSE.get(name, str)(v)
        except ValueError as err:
            raise TrainplanError(f"{where.get(name, where['_row'])}: bad value for {name!r}: {err}") from err
    for name in _NON_NEGATIVE:
        if values[name] is not None and values[name] < 0:  # type: ignore[operator]
            raise TrainplanError(f"{where.get(name, where['_row'])}: {name} must be >= 0, got {values[name]}.")
    if values["accelerator_count"] < 1:  # type: ignore[operator]
        raise TrainplanError(f"{where.get('accelerator_count', where['_row'])}: accelerator_count must be >= 1.")
    for name, allowed in (("status", STATUSES), ("quota_kind", QUOTA_KINDS)):
        if values[name] not in allowed:
            raise TrainplanError(f"{where.get(name, where['_row'])}: {name} {values[name]!r} is not allowed.",
                                 allowed=", ".join(allowed))
    if values["status"] != "current" and not (values["status_as_of"] or values["retired_on"]):
        raise TrainplanError(f"{where['_row']}: a {values['status']} platform needs status_as_of or retired_on.")
    try:
        values["accelerator_id"] = get_accelerator(str(values["accelerator_id"])).id
    except TrainplanError as err:
        raise TrainplanError(f"{where.get('accelerator_id', where['_row'])}: {err.what}",
                             allowed=err.allowed, fix=err.fix) from err
    return Platform(**values)  # type: ignore[arg-type]


@functools.cache
def _builtin() -> dict[str, Platform]:
    text = resources.files("trainplan").joinpath("data").joinpath("platforms.csv").read_text(encoding="utf-8")
    out: dict[str, Platform] = {}
    for line, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        here = f"data/platforms.csv:{line}"
        p = _build(row, {"_row": here}, builtin=True)
        if p.id in out:
            raise TrainplanError(f"{here}: duplicate platform id {p.id!r}.")
        out[p.id] = p
    return out


def _scalar(node: yaml.Node, where: str, what: str) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        raise TrainplanError(f"{where}: {what} must be a single value, not a list or mapping.")
    if node.tag.endswith(":null"):
        return None
    return str(node.value)


def read_platforms_file(path: str) -> list[Platform]:
    """Parse and validate a user platforms YAML file; errors name the file and the line."""
    try:
        with open(path, encoding="utf-8") as fh:
            root = yaml.compose(fh)
    except OSError as err:
        raise TrainplanError(f"Cannot read platforms file {path!r}: {err.strerror}.") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise TrainplanError(f"{path}{line}: not valid YAML ({getattr(err, 'problem', err)}).") from err
    if isinstance(root, yaml.MappingNode):
        root = next((v for k, v in root.value if getattr(k, "value", None) == "platforms"), root)
    if not isinstance(root, yaml.SequenceNode):
        line = f":{root.start_mark.line + 1}" if root is not None else ""
        raise TrainplanError(f"{path}{line}: expected a list of platforms.",
                             fix="write `- id: ...` entries, or a `platforms:` key holding that list")
    out: list[Platform] = []
    seen: dict[str, str] = {}
    for item in root.value:
        row_where = f"{path}:{item.start_mark.line + 1}"
        if not isinstance(item, yaml.MappingNode):
            raise TrainplanError(f"{row_where}: each platform must be a mapping of field: value.")
        raw: dict[str, str | None] = {}
        where = {"_row": row_where}
        for key_node, value_node in item.value:
            key = str(key_node.value)
            here = f"{path}:{key_node.start_mark.line + 1}"
            if key not in FIELD_NAMES:
                raise unknown("platform field", key, FIELD_NAMES, allowed=", ".join(FIELD_NAMES),
                              what=f"{here}: unknown platform field {key!r}.")
            raw[key] = _scalar(value_node, f"{path}:{value_node.start_mark.line + 1}", key)
            where[key] = f"{path}:{value_node.start_mark.line + 1}"
        p = _build(raw, where, builtin=False)
        if p.id in seen:
            raise TrainplanError(f"{row_where}: platform id {p.id!r} is already defined at {seen[p.id]}.")
        seen[p.id] = row_where
        out.append(p)
    return out


def load_platforms(extra_file: str | None = None) -> dict[str, Platform]:
    """Built-in platforms by id, plus (overriding by id) those of a user YAML file."""
    out = dict(_builtin())
    if extra_file:
        out.update({p.id: p for p in read_platforms_file(extra_file)})
    return out


def get_platform(name: str, extra_file: str | None = None) -> Platform:
    """Look up a platform by id, case-insensitive; retired ones are returned too."""
    return _find(load_platforms(extra_file), name, hint="run `trainplan catalog` to list them")


def _find(catalog: dict[str, Platform], name: str, hint: str) -> Platform:
    """The platform `name` names in `catalog` (case-insensitive, retired ones too), else an
    error naming the close matches, each no longer offered with its status."""
    key = str(name).strip().lower()
    for pid, p in catalog.items():
        if pid.lower() == key:
            return p
    raise unknown("platform", str(name), catalog, hint=hint,
                  note=lambda m: _status_note(catalog[m]))


def _status_note(p: Platform) -> str:
    """What follows a platform no longer offered where it is suggested: " (retired 2026-09-15)",
    or " (retired as of 2026-09-17)" where only the date it was known is; "" for a current one."""
    if p.is_current:
        return ""
    if p.retired_on:
        return f" ({p.status} {p.retired_on})"
    return f" ({p.status} as of {p.status_as_of})"


def select_platforms(ids: list[str] | tuple[str, ...] | None, platforms_file: str | None = None
                     ) -> list[Platform]:
    """Platforms by id (case-insensitive, retired ones too), or all current ones."""
    catalog = load_platforms(platforms_file)
    if not ids:
        return [p for p in catalog.values() if p.is_current]
    out = []
    for i in ids:
        p = _find(catalog, i, hint="list them with `trainplan catalog platforms`, or add your own "
                                   "with --platforms-file")
        if p not in out:
            out.append(p)
    return out


def platforms_with(gpu: str | None, gpus: int | None, platforms_file: str | None = None
                   ) -> list[Platform]:
    """The current platforms with `gpus` units of accelerator `gpu` (`trainplan plan --gpu H100
    --gpus 4`); either may be None (any). When the catalog (plus `platforms_file`) has none with
    both, one is built from the accelerator catalog (`built_platform`)."""
    catalog = load_platforms(platforms_file)
    accel = get_accelerator(gpu) if gpu else None
    if gpus is not None and gpus < 1:
        raise TrainplanError(f"--gpus must be a positive integer, got {gpus}.")
    found = [p for p in catalog.values() if p.is_current
             and (accel is None or p.accelerator_id == accel.id)
             and (gpus is None or p.accelerator_count == gpus)]
    if found:
        return found
    if accel is None:
        counts = sorted({p.accelerator_count for p in catalog.values() if p.is_current})
        raise TrainplanError(f"No current platform has {gpus} accelerators.",
                             allowed="counts: " + ", ".join(map(str, counts)),
                             fix="add --gpu ID to plan on that many of one accelerator")
    return [built_platform(accel, gpus or 1, catalog)]


def built_platform(accel, count: int, catalog: dict[str, Platform]) -> Platform:
    """`count` x `accel` where no catalog platform offers it: no session or quota limits (as a
    cloud instance or own hardware); priced per accelerator-hour from the cheapest current priced
    catalog platform with that accelerator, else $0 (said in `notes`)."""
    priced = sorted((p.usd_per_hour / p.accelerator_count, p.id) for p in catalog.values()
                    if p.is_current and p.accelerator_id == accel.id and p.usd_per_hour > 0)
    if priced:
        rate, source = priced[0]
        price = f"price: {count} x ${rate:.2f}/h per accelerator, as on {source}"
    else:
        rate, price = 0.0, "price unknown: no catalog platform sells this accelerator; cost shows $0"
    return Platform(
        id=f"{accel.id}-x{count}", provider="built", name=f"{count} x {accel.name}",
        accelerator_id=accel.id, accelerator_count=count, status="current", status_as_of=None,
        retired_on=None, session_max_s=None, idle_timeout_s=None, weekly_quota_s=None,
        quota_kind="none", ram_bytes=None, cpu_cores=None, disk_bytes=None,
        output_file_limit=None, usd_per_hour=rate * count, usd_per_month=None,
        compute_units_per_hour=None, usd_per_compute_unit=None, background_execution=True,
        notes=f"built from the accelerator catalog for --gpu/--gpus (no catalog platform has "
              f"{count} x {accel.id}); no session, quota or host limits; {price}",
        sources=("--gpu/--gpus",), as_of=None)


@dataclass(frozen=True)
class HostCPU:
    """A platform's host CPU as the step-time model sees it (data/host_cpus.csv): `speed` is its
    single-thread rating over the reference host's, what scales the host's time to issue each
    kernel (predict/host.py)."""

    cpu: str
    speed: float
    matched: str            # the row's platform pattern ("reference": no row for the platform)


@functools.cache
def _host_rows() -> list[dict[str, str]]:
    text = resources.files("trainplan").joinpath("data").joinpath("host_cpus.csv").read_text(
        encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def host_cpu(platform_id: str) -> HostCPU:
    """The first row of data/host_cpus.csv whose pattern (fnmatch) matches the platform id, else
    the reference host (speed 1)."""
    import fnmatch
    rows = _host_rows()
    ref = next(r for r in rows if r["platform"] == "reference")
    ref_rate = float(ref["passmark_single_thread"])
    for r in rows:
        if r["platform"] != "reference" and fnmatch.fnmatchcase(platform_id, r["platform"]):
            return HostCPU(r["cpu"], float(r["passmark_single_thread"]) / ref_rate, r["platform"])
    return HostCPU(ref["cpu"], 1.0, "reference")
