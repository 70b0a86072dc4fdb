"""Crash and resume: kill a training run with SIGKILL at random moments (seeded) and measure what each kill cost.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/crash_resume.py --kills 5
    python benchmarks/crash_resume.py --corpus my.txt --save-every 5m --kills 3 --min-wait 60 --max-wait 900

Each round starts ``textgen train`` (``--resume`` after the first), waits until it is training (its
"device" line), lets it train for a random time, kills it with SIGKILL (no handler runs), and reads
the run directory as the next process will:

* **lost**: training time the kill threw away, from the moment training started (or the last commit
  of state.json, if later) to the kill; the target is at most ``--save-every`` plus one batch;
* **consistent**: the committed state names files that exist, the history has exactly one row per
  finished epoch, and the best weights are never worse than the committed best loss.

A last round lets the run finish, and the whole run is checked again. Everything after ``--`` goes to
``textgen train`` (e.g. ``-- --units 256``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REF_CORPUS


def training_started(output: Path, proc: subprocess.Popen, timeout: float = 600) -> float:
    """When the process printed its "device" line (training starts right after), by the wall clock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if output.exists() and "\ndevice " in "\n" + output.read_text(errors="replace"):
            return time.time()
        if proc.poll() is not None:
            raise SystemExit(f"textgen train ended before training (exit {proc.returncode}):\n{output.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"textgen train did not start training within {timeout:.0f} s")


def check(run_dir: Path) -> list[str]:
    """What is inconsistent in the run as the next process would find it (empty: nothing)."""
    from textgen.checkpoint import Run
    from textgen.plot import read_history

    run = Run(run_dir)
    if not run.has_state():
        return []  # killed before its first save: resuming starts it cleanly
    problems = []
    try:
        run.check_usable()
        state = run.load_state()
    except Exception as exc:  # any failure to read it is the finding
        return [f"unreadable: {exc}"]
    epochs = [int(e) for e in read_history(run.history_path).get("epoch", [])]
    if epochs != list(range(state.epoch)):
        problems.append(f"history epochs {epochs} for {state.epoch} committed epochs")
    if [row["epoch"] for row in state.history or ()] != list(range(state.epoch)):
        problems.append("state.json's history disagrees with its epoch")
    if run.best_weights_path.exists() and run.best_weights_loss() > state.best_val_loss + 1e-9:
        problems.append("the best weights are worse than the committed best loss")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default=REF_CORPUS)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-every", default="30s", help="textgen train --save-every (its default is 5m)")
    parser.add_argument("--min-wait", type=float, default=10.0, help="seconds of training before a kill, at least")
    parser.add_argument("--max-wait", type=float, default=75.0, help="... and at most")
    parser.add_argument("--checkpoint-dir", help="keep the run here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="one JSON object per round and one at the end")
    parser.add_argument("train_args", nargs="*", help="more textgen train flags, after --")
    args = parser.parse_args()
    from textgen.checkpoint import Run
    from textgen.durations import parse_duration

    save_every = parse_duration(args.save_every, "--save-every")
    rng = random.Random(args.seed)
    rounds: list[dict[str, Any]] = []  # one JSON record a round
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint_dir = Path(args.checkpoint_dir or scratch)
        run_dir = checkpoint_dir / "crash"
        command = [sys.executable, "-m", "textgen", "train", args.corpus, "--device", "cpu", "--run", "crash"]
        command += ["--checkpoint-dir", str(checkpoint_dir), "--save-every", args.save_every, *args.train_args]
        for round_number in range(args.kills + 1):
            output = Path(scratch) / f"round-{round_number}.txt"
            with open(output, "w") as fh:
                resume = ["--resume"] if round_number else []
                proc = subprocess.Popen([*command, *resume], stdout=fh, stderr=subprocess.STDOUT)
            started = training_started(output, proc)
            if round_number == args.kills:  # the last round trains to the end
                if proc.wait() != 0:
                    raise SystemExit(f"the final round failed:\n{output.read_text()}")
                break
            wait = rng.uniform(args.min_wait, args.max_wait)
            time.sleep(wait)
            if proc.poll() is not None:  # the run ended first: nothing left to kill or resume
                if proc.returncode != 0:
                    raise SystemExit(f"textgen train failed:\n{output.read_text()}")
                print(f"round {round_number + 1}: the run finished before the kill", flush=True)
                break
            killed = time.time()
            proc.kill()
            proc.wait()
            state_path = run_dir / "state.json"
            committed = state_path.stat().st_mtime if state_path.exists() else 0.0
            report = {
                "round": round_number + 1,
                "killed_after_s": round(killed - started, 2),
                "lost_s": round(killed - max(started, committed), 2),
                "problems": check(run_dir),
            }
            rounds.append(report)
            print(json.dumps(report) if args.json else describe(report), flush=True)
        final_problems = check(run_dir)
        history = Run(run_dir).load_state().history
        chars_per_sec = history[-1]["chars_per_sec"] if history else math.nan
        batch_s = _batch_chars(run_dir) / chars_per_sec if chars_per_sec else math.nan
    budget = save_every + batch_s
    summary = {
        "kills": args.kills,
        "save_every_s": save_every,
        "batch_s": round(batch_s, 3),
        "max_lost_s": max((r["lost_s"] for r in rounds), default=0.0),
        "allowed_s": round(budget, 3),
        "damaged_rounds": sum(bool(r["problems"]) for r in rounds),
        "final_problems": final_problems,
    }
    summary["met"] = summary["max_lost_s"] <= budget and not summary["damaged_rounds"] and not final_problems
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"\n{args.kills} kills: at most {summary['max_lost_s']:.1f} s of training lost (allowed: --save-every "
            f"{save_every:g} s + one batch {batch_s:.2f} s = {budget:.1f} s); {summary['damaged_rounds']} of "
            f"{args.kills} kills left the run damaged; final run {'; '.join(final_problems) or 'consistent'}: "
            f"{'met' if summary['met'] else 'MISSED'}"
        )


def _batch_chars(run_dir: Path) -> int:
    data = json.loads((run_dir / "config.json").read_text())["data"]
    return int(data["batch_size"]) * int(data["seq_len"])


def describe(report: dict) -> str:
    problems = "; ".join(report["problems"]) or "consistent"
    return (
        f"round {report['round']}: killed after {report['killed_after_s']:.1f} s of training, "
        f"lost {report['lost_s']:.1f} s; {problems}"
    )


if __name__ == "__main__":
    main()
