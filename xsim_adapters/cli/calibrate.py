"""``xsim calibrate``: fit a device type's compute constant to measured iteration times."""

from __future__ import annotations

import argparse
import math
import sys

from .args import common_args


def add_calibrate_arguments(cal: argparse.ArgumentParser) -> None:
    """The options of ``xsim calibrate``."""
    cal.add_argument("--measured", action="append", required=True, metavar="PLAN=SECONDS",
                     help="A plan you ran and its measured iteration time; repeat for several.")
    cal.add_argument("--device-type", required=True, metavar="NAME",
                     help="The device type whose constant is fitted (every plan must use it).")
    cal.add_argument("--field", default="efficiency", choices=("efficiency", "hbm_efficiency"),
                     help="The constant to fit (default: efficiency).")
    common_args(cal, force=False, progress=False)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``xsim calibrate``: fit a device type's efficiency to measured iteration times."""
    from ..calibrate import fit
    from ..feasibility import load_plan

    pairs = []
    for item in args.measured:
        path, sep, secs = item.rpartition("=")
        try:
            value = float(secs)
        except ValueError:
            value = float("nan")
        if not sep or not path or not (math.isfinite(value) and value > 0):
            print(f"xsim: error: --measured: expected PLAN=SECONDS with SECONDS a finite "
                  f"number > 0 (got {item[:200]!r})", file=sys.stderr)
            return 2  # a usage error, as argparse's
        pairs.append((load_plan(path), value))
    c = fit(pairs, args.device_type, args.field)
    print(f"{c.device_type}.{c.field}: {c.before:g} -> {c.value:g}"
          f" ({c.simulations} simulations{'; at the search bound' if c.at_bound else ''})")
    for (plan, secs), e0, e1 in zip(pairs, c.errors_before, c.errors_after, strict=True):
        print(f"  {plan.name}: measured {secs:g} s, error {100 * e0:+.1f}% -> {100 * e1:+.1f}%")
    print(f"plan override:\n  device_types:\n    {c.device_type}: {{{c.field}: {c.value:g}}}")
    return 0
