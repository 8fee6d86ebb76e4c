"""Checkpoint folders on disk: fsync, the commit marker, verification, removal, room.

The marker `trainplan-commit.json` lists every file of a checkpoint with its size and CRC-32
(zlib's: a check against truncation and damage, not against tampering). A folder is committed
when its marker is there: for the plain loop it is written inside the temporary folder before
the rename (the rename is the commit), for the Hugging Face Trainer into `checkpoint-N/` once
the Trainer's files are fsynced (the marker's own rename is the commit).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from pathlib import Path

PREFIX = "ckpt-"
HF_PREFIX = "checkpoint-"
STATE = "state.pt"
COMMIT = "trainplan-commit.json"
TMP = ".tmp-"                      # a save or a prune in progress: removed at start-up
PROBE = ".tmp-probe-"              # the writability probe (a live one is not removed)
OLD = ".old-"                      # a checkpoint being replaced by one of the same step
SLACK_BYTES = 1 << 20              # file-system blocks and the marker, beside the data
FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))

try:                               # the one formatter for display; a kit may run without it
    from trainplan.units import fmt_bytes
except ImportError:                # pragma: no cover
    def fmt_bytes(n: float) -> str:
        if n >= 1 << 30:
            return f"{n / (1 << 30):.2f} GiB"
        if n >= 1 << 20:
            return f"{n / (1 << 20):.1f} MiB"
        return f"{n / 1024:.1f} KiB" if n else "0 B"


class GuardError(RuntimeError):
    """The checkpoint folder cannot hold what the guard must write: what is wrong, what to do."""

    def __init__(self, what: str, fix: str | None = None):
        self.what, self.fix = what, fix
        super().__init__(what + (f"\nTo fix: {fix}" if fix else ""))

    def __reduce__(self):          # passed between ranks by pickling
        return (GuardError, (self.what, self.fix))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sum_file(path: Path, fsync: bool = False) -> dict:
    """{"bytes", "crc32"} of a file (fsynced first when asked: the Trainer does not)."""
    crc, n = 0, 0
    with open(path, "rb") as f:
        if fsync:
            os.fsync(f.fileno())
        while chunk := f.read(1 << 22):
            crc, n = zlib.crc32(chunk, crc), n + len(chunk)
    return {"bytes": n, "crc32": crc}


def files_of(folder: Path) -> list[Path]:
    """Every file of a checkpoint but its marker."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMMIT)


def bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def write_marker(folder: Path, step: int, files: dict, world: int) -> None:
    """The commit marker, written whole: temp file, fsync, rename, fsync the folder."""
    doc = {"format": 1, "step": step, "world_size": world, "files": files,
           "written_by": "trainplan.guard"}
    tmp = folder / f"{TMP}{COMMIT}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / COMMIT)
    fsync_dir(folder)


def verify(folder: str | os.PathLike) -> str | None:
    """None when `folder` matches its commit marker, else what is wrong, naming the file."""
    folder = Path(folder)
    try:
        files = json.loads((folder / COMMIT).read_text())["files"]
        items = list(files.items())
    except FileNotFoundError:
        return f"{folder} has no commit marker ({COMMIT}): not committed"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{folder / COMMIT} is unreadable"
    for name, want in items:
        p = folder / name
        if not p.is_file():
            return f"{p} is missing"
        got = sum_file(p)
        if got["bytes"] != want.get("bytes"):
            return (f"{p} holds {fmt_bytes(got['bytes'])} ({got['bytes']} bytes); its commit "
                    f"marker says {want.get('bytes')} bytes")
        if got["crc32"] != want.get("crc32"):
            return f"{p} does not match its checksum (damaged after it was written)"
    return None


def remove(path: Path) -> None:
    """Rename away, then delete: a kill part-way leaves a `.tmp-` folder, never half a
    checkpoint under a checkpoint's name."""
    gone = path.with_name(f"{TMP}del-{path.name}")
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def step_of(path: Path, prefix: str) -> int:
    try:
        return int(path.name[len(prefix):])
    except ValueError:
        return -1


def committed(folder: str | os.PathLike, prefix: str = PREFIX) -> list[tuple[int, Path]]:
    """(step, folder) of the checkpoints in `folder` that carry a commit marker, oldest first.
    Plain-loop checkpoints written before markers existed count too (their rename was the
    commit; `resume` checks that they load)."""
    d = Path(folder)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        if p.name.startswith(prefix) and p.is_dir() and step_of(p, prefix) >= 0 and (
                (p / COMMIT).is_file() or (prefix == PREFIX and (p / STATE).is_file())):
            out.append((step_of(p, prefix), p))
    return sorted(out)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest plain-loop checkpoint that matches its commit marker, or None. Reads only."""
    for _step, path in reversed(committed(directory)):
        if not (path / COMMIT).exists() or verify(path) is None:
            return path
    return None


def check_folder(d: Path) -> None:
    """`d` is a folder this process can write (made if missing); GuardError otherwise."""
    if d.exists() and not d.is_dir():
        raise GuardError(f"checkpoint folder {d} is a file, not a folder.",
                         fix="point the guard at a folder (TRAINPLAN_CHECKPOINT_DIR)")
    probe = d / f"{PROBE}{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink(missing_ok=True)
    except OSError as e:
        raise GuardError(f"checkpoint folder {d} is not writable: {e.strerror or e}.",
                         fix="point the guard at a writable folder on a disk that keeps files "
                             "between sessions") from None


def clean(d: Path, log) -> None:
    """Leftovers of a kill in `d`: `.tmp-*` (a save or a prune cut short) removed; a checkpoint
    cut short while being replaced by one of the same step put back."""
    if not d.is_dir():
        return
    for p in sorted(d.iterdir()):
        if p.name.startswith(OLD):
            back = d / p.name[len(OLD):]
            if not back.exists() and (p / COMMIT).is_file():
                os.rename(p, back)
                log(f"restored {back.name} (its replacement was cut short)")
            else:
                shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(PROBE):
            if not _alive(p.name[len(PROBE):]):
                p.unlink(missing_ok=True)
        elif p.name.startswith(TMP):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            log(f"removed {p.name}: a save or prune cut short by a kill")


def _alive(pid: str) -> bool:
    """Whether process `pid` runs (a probe of a live process is left to it)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def free_bytes(folder: Path, disk_bytes: int | None) -> int:
    """Room for checkpoints: the disk's free bytes, within `disk_bytes` less what the folder
    holds where a platform caps its output."""
    free = shutil.disk_usage(folder).free
    if disk_bytes:
        free = min(free, int(disk_bytes) - bytes_under(folder))
    return max(0, free)


def disk_full(folder: Path, needed: int, free: int, when: str) -> GuardError:
    return GuardError(
        f"disk full at {folder}: {fmt_bytes(needed)} needed, {fmt_bytes(free)} free ({when}).",
        fix="free space there, keep fewer checkpoints (keep_last), or point the checkpoint "
            "folder at a bigger disk; the complete checkpoints are still there")


class HashingWriter:
    """What torch.save writes through: the CRC-32 and size as it goes, and the OSError it met
    (torch reports a failed write as a RuntimeError without the errno)."""

    def __init__(self, f):
        self.f, self.crc, self.n, self.error = f, 0, 0, None

    def write(self, b) -> int:
        try:
            n = self.f.write(b)
        except OSError as e:
            self.error = e
            raise
        self.crc, self.n = zlib.crc32(b, self.crc), self.n + len(b)
        return n

    def flush(self) -> None:
        self.f.flush()
