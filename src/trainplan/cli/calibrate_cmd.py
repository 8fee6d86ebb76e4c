"""`trainplan calibrate`: fit a per-accelerator step-time correction on measurement records.

Estimates for a calibrated accelerator are corrected and say so; other accelerators are untouched.
"""
from __future__ import annotations

import argparse
import json


def calibrate_command_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="correct step-time predictions with your measurements",
        description="Fit, per accelerator, the median of measured / predicted step time over "
                    "the records of `trainplan measure` (and of trainplan.measure.record / "
                    "TrainplanCallback), and store it in $TRAINPLAN_HOME/calibration.json. "
                    "Accelerators not in the records keep their earlier calibration.")
    p.add_argument("--records", action="append", metavar="FILE",
                   help="JSON-lines records (repeatable; default "
                        "$TRAINPLAN_HOME/measurements.jsonl)")
    p.add_argument("--show", action="store_true", help="print the stored calibration, change nothing")
    p.add_argument("--reset", action="store_true", help="delete the stored calibration")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=calibrate_command)


def calibrate_command(args: argparse.Namespace) -> int:
    from ..errors import TrainplanError
    from ..measure import calibrate as cal
    from ..measure.records import default_records_path, read_records
    from ..report.measure_report import calibrate_text
    if args.show and args.reset:
        raise TrainplanError("--show and --reset do not go together.",
                             fix="run `trainplan calibrate --reset`, then --show")
    path = cal.calibration_path()
    kept: list[str] = []
    skipped: list[str] = []
    notes: list[str] = []
    if args.reset:
        gone = cal.reset()
        print(f"deleted {gone}" if gone else f"no calibration to delete ({path})")
        return 0
    if args.show:
        cals = cal.load()
    else:
        files = args.records or [str(default_records_path())]
        records = []
        for f in files:
            for i, rec in enumerate(read_records(f, skipped), start=1):
                ok, why = cal.usable(rec)
                if ok:
                    records.append(rec)
                    if rec["device"].get("type") == "cpu":
                        notes.append(f"{f} record {i} was measured on the CPU and labelled "
                                       f"{rec['accelerator']} with --accelerator: used, as asked")
                else:
                    skipped.append(f"{f} record {i} ({rec['job'].get('model')}): {why}")
        fitted = cal.fit(records, tuple(files))
        if not fitted:
            raise TrainplanError("No record can calibrate: each needs a catalog accelerator and "
                                 "a prediction.", fix="run `trainplan measure JOB` on a GPU (or "
                                 "with --accelerator ID)")
        path, kept = cal.save(fitted)
        cals = cal.load(path)
    if args.format == "json":
        print(json.dumps({k: v.to_dict() for k, v in cals.items()}, indent=2))
    else:
        calibrate_text(cals, path, kept, skipped, notes)
    return 0
