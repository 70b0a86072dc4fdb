"""How close ``textgen train --time-budget`` ends to its budget, timed as a user times it: from launching the command
to its exit (Python's and TensorFlow's start-up, planning, compiling, the last validation, sample and save
included).

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/budget.py --budgets 60s 2m

Each budget is a new run on War and Peace (the default recipe, the cpu profile) in a scratch checkpoint directory;
the table gives the wall clock, its difference from the budget (the target: within 15 s), and what the run said of
itself (its training seconds and epochs, from ``--json``). Run nothing else meanwhile: 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from textgen.durations import format_seconds, parse_duration


def timed_run(budget: str, corpus: str, checkpoint_dir: Path) -> tuple[float, dict]:
    """Wall-clock seconds of one ``textgen train`` with ``budget``, and its final JSON record."""
    command = [sys.executable, "-m", "textgen", "train", corpus, "--device", "cpu", "--time-budget", budget]
    command += ["--checkpoint-dir", str(checkpoint_dir), "--json"]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return took, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", nargs="+", default=["60s", "2m"])
    parser.add_argument("--corpus", default="2600-0.txt")
    args = parser.parse_args()
    print("| --time-budget | wall clock, launch to exit | minus the budget | run's own seconds | epochs | stopped by |")
    print("|---|---|---|---|---|---|")
    for budget in args.budgets:
        with tempfile.TemporaryDirectory(prefix="textgen-budget-") as scratch:
            took, done = timed_run(budget, args.corpus, Path(scratch))
        over = took - parse_duration(budget)
        print(
            f"| {budget} | {format_seconds(took)} | {over:+.1f} s | {done['seconds']:.1f} s | {done['epochs']} "
            f"| {done['stop_reason']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
