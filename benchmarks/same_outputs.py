#!/usr/bin/env python3
"""Every command's output on fixed inputs, saved once and compared after a change that must not move a digit.

    python benchmarks/same_outputs.py save /tmp/before        # on the code before the change
    python benchmarks/same_outputs.py compare /tmp/before     # on the code after it: exit 1 at the first difference

Inputs: both bundled samples, and a 20 M-token dump from ``sample_data/make_synthetic.py`` (``--tokens``; written
once to ``--dir`` and reused). Commands, each a fresh process of the CLI: ``analyze``, ``compare-presets``, ``sweep``
and ``check --gates default`` as JSON, ``diff`` of the first and second half of the steps as JSON, ``report`` (its HTML
with the generation time taken out), and ``watch -f jsonl`` over a directory of one file per step. Outputs are
compared byte for byte, except ``elapsed_seconds``-like timings (none today) and the report's time stamp.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ("sample_data/textgenrnn_bf16_vs_fp32.parquet", "sample_data/synthetic_multiturn.parquet")
STAMP = re.compile(r"rollout-diag [^ <]* · \d{4}-\d\d-\d\d \d\d:\d\d UTC")


def at_any_root(text: str) -> str:
    """``text`` with this checkout's path written as ``<repo>``, so that outputs saved in one checkout (main) compare
    with those of another (a worktree): the samples' paths are in every document."""
    return text.replace(str(ROOT), "<repo>")


def cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "from rollout_diag.cli import main; main()", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def inputs(directory: Path, tokens: int) -> dict[str, Path]:
    """name -> dump: the samples, the large synthetic dump and a one-file-per-step directory of the real sample."""
    directory.mkdir(parents=True, exist_ok=True)
    found = {Path(sample).stem: ROOT / sample for sample in SAMPLES}
    large = directory / f"same_outputs_{tokens}.parquet"
    if not large.exists():
        subprocess.run(
            [sys.executable, "sample_data/make_synthetic.py", "--tokens", str(tokens), "--out", str(large)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    found["large"] = large
    steps = directory / "same_outputs_steps"
    if not steps.exists():
        subprocess.run(
            [sys.executable, "benchmarks/split_dump.py", SAMPLES[0], str(steps), "--ranks", "1"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    found["steps_dir"] = steps
    return found


def halves(dump: Path) -> tuple[str, str]:
    """``--steps-a`` and ``--steps-b`` of a dump's first and second half of its steps."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    steps = sorted(pc.unique(pq.read_table(dump, columns=["step"])["step"]).to_pylist())
    middle = len(steps) // 2
    return f"{steps[0]}:{steps[middle - 1]}", f"{steps[middle]}:{steps[-1]}"


def outputs(dumps: dict[str, Path], scratch: Path) -> dict[str, str]:
    """Output name -> text, every command on every input it takes."""
    scratch.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}

    def run(name: str, *args: str, codes: tuple[int, ...] = (0,)) -> None:
        done = cli(*args)
        if done.returncode not in codes:
            raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip()[-800:]}")
        found[name] = at_any_root(done.stdout)

    for label in ("textgenrnn_bf16_vs_fp32", "synthetic_multiturn", "large"):
        dump = str(dumps[label])
        run(f"{label}.analyze.json", "analyze", dump, "-f", "json", "--device", "cpu")
        run(f"{label}.compare-presets.json", "compare-presets", dump, "-f", "json", "--device", "cpu")
        run(f"{label}.sweep.json", "sweep", dump, "-f", "json", "--device", "cpu")
        run(f"{label}.check.json", "check", dump, "--gates", "default", "-f", "json", "--device", "cpu", codes=(0, 3))
        first, later = halves(dumps[label])
        run(f"{label}.diff.json", "diff", dump, "--steps-a", first, "--steps-b", later, "-f", "json", "--device", "cpu")
        html = scratch / f"{label}.html"
        run(f"{label}.report.log", "report", dump, "-o", str(html), "--device", "cpu")
        found[f"{label}.report.html"] = at_any_root(STAMP.sub("rollout-diag · (time)", html.read_text()))
        del found[f"{label}.report.log"]  # says where it wrote, a path in the scratch directory
    run(
        "steps_dir.watch.jsonl",
        "watch",
        str(dumps["steps_dir"]),
        "-f",
        "jsonl",
        "--interval",
        "0.2",
        "--exit-after-idle",
        "1",
        codes=(0, 3),
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("outputs", type=Path, help="where the outputs are saved / were saved")
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the generated dumps stay")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:  # the reports of this run alone (several may run at once)
        found = outputs(inputs(args.dir, args.tokens), Path(scratch))
    if args.action == "save":
        args.outputs.mkdir(parents=True, exist_ok=True)
        for name, text in found.items():
            (args.outputs / name).write_text(text)
        print(f"saved {len(found)} outputs to {args.outputs}")
        return
    differing = []
    for name, text in sorted(found.items()):
        saved = args.outputs / name
        before = saved.read_text() if saved.exists() else None
        if before != text:
            differing.append(name)
            diff = difflib.unified_diff(
                (before or "").splitlines(), text.splitlines(), "before", "after", n=0, lineterm=""
            )
            print(f"--- {name} differs:\n" + "\n".join(line[:300] for line in list(diff)[:12]))
    print(f"{len(found) - len(differing)} of {len(found)} outputs identical")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
