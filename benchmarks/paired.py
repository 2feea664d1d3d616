#!/usr/bin/env python3
"""Two commands timed in turn, A B A B …, as whole processes: the method behind every ratio in docs/benchmarks.md.

    python benchmarks/paired.py -n 5 \\
        --a "rollout-diag analyze big.parquet -f json -o /dev/null" \\
        --b "env PYTHONPATH=/old/checkout python -P -m rollout_diag.cli analyze big.parquet -f json -o /dev/null"

One warm-up of each (kernels and bytecode cached), then ``-n`` counted pairs. Each run's user and system CPU and peak
resident set come from the kernel's accounting of the finished child (``os.wait4``, what ``/usr/bin/time -v``
reports); wall time from a monotonic clock. Prints each figure's min, median and max, and the ratio A/B pair by pair
(min, median, max): on a shared machine whose speed drifts, quote the median ratio, never one wall time.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import time

FIGURES = ("user s", "sys s", "cpu s", "wall s", "peak MiB")


def run(command: list[str]) -> dict[str, float]:
    """One whole-process run of ``command`` (its output thrown away): its figures."""
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{shlex.join(command)} exited with {os.waitstatus_to_exitcode(status)}")
    cpu = usage.ru_utime + usage.ru_stime
    return dict(zip(FIGURES, (usage.ru_utime, usage.ru_stime, cpu, wall, usage.ru_maxrss / 1024), strict=True))


def spread(values: list[float]) -> str:
    return f"{min(values):10.3f} {statistics.median(values):10.3f} {max(values):10.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the command measured (one string, split as a shell would)")
    parser.add_argument("--b", required=True, help="the command it is compared with")
    parser.add_argument("-n", type=int, default=5, help="counted pairs (default 5)")
    args = parser.parse_args()
    a, b = shlex.split(args.a), shlex.split(args.b)
    run(a), run(b)  # warm-up: compiled kernels and bytecode cached, files in the page cache
    pairs = [(run(a), run(b)) for _ in range(args.n)]
    print(f"{args.n} pairs after one warm-up each; min, median, max")
    for side, index in (("A", 0), ("B", 1)):
        for figure in FIGURES:
            print(f"{side} {figure:9} {spread([pair[index][figure] for pair in pairs])}")
    for figure in ("user s", "cpu s", "wall s"):
        print(f"A/B {figure[:-2]:7} {spread([first[figure] / second[figure] for first, second in pairs])}")


if __name__ == "__main__":
    main()
