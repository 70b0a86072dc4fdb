"""Model quality for recipes: train on War and Peace for a fixed wall-clock budget, score the test split.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m -- --units 512
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m \\
        --recipe "" --recipe "--lr 0.004" --recipe "--layers 2 --dropout 0.2"

Everything after ``--`` (or each ``--recipe``, a quoted list of flags; "" for the defaults) goes
to ``textgen train`` as it is: units, layers, embedding, dropout, batch, sequence length, learning
rate and schedule, clipping. Recipes run one after another, each in its own process with the
whole machine. Runs are written under a temporary checkpoint directory unless
``--checkpoint-dir`` is given. For each recipe: test nats/char and bits/char, the epochs done
and the training chars/s; with several recipes, a table ranked by test loss at the end.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile

from common import REF_CORPUS


def textgen(*args: str) -> list[dict]:
    """Run a textgen command with --json; its JSON lines (stops the benchmark if it fails)."""
    done = subprocess.run([sys.executable, "-m", "textgen", *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"textgen {args[0]} failed: {done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def measure(recipe: list[str], corpus: str, time_budget: str, checkpoint_dir: str) -> dict:
    """Train ``recipe`` for ``time_budget`` and score its best checkpoint on the test split."""
    lines = textgen(
        "train", corpus, "--device", "cpu", "--time-budget", time_budget, "--checkpoint-dir", checkpoint_dir, *recipe
    )
    epochs = [line for line in lines if line.get("event") == "epoch"]
    done = lines[-1]
    scored = textgen("evaluate", "--run", done["run"], "--checkpoint-dir", checkpoint_dir, "--split", "test")[0]
    batches = sum(e["batches"] for e in epochs)
    return {
        "recipe": " ".join(recipe) or "(defaults)",
        "run": done["run"],
        "time_budget": time_budget,
        "epochs": done["epochs"],
        "batches": batches,
        "chars_per_sec": sum(e["chars_per_sec"] * e["batches"] for e in epochs) / max(batches, 1),
        "best_val_nats_per_char": done["best_val_loss"],
        "test_nats_per_char": scored["nats_per_char"],
        "test_bits_per_char": scored["bits_per_char"],
        "test_chars": scored["chars"],
    }


def describe(report: dict) -> str:
    """One line for one recipe's result."""
    return (
        f"recipe {report['recipe']}, budget {report['time_budget']}: "
        f"{report['epochs']} epochs at {report['chars_per_sec']:,.0f} chars/s; "
        f"test {report['test_nats_per_char']:.4f} nats/char = {report['test_bits_per_char']:.4f} bits/char "
        f"({report['test_chars']:,} chars); best validation {report['best_val_nats_per_char']:.4f} nats/char"
    )


def ranking(reports: list[dict]) -> str:
    """A markdown table of the reports, lowest test loss first."""
    rows = [
        "| recipe | epochs | chars/s | best val nats/char | test nats/char | test bits/char |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(reports, key=lambda r: r["test_nats_per_char"]):
        rows.append(
            f"| `{r['recipe']}` | {r['epochs']} | {r['chars_per_sec']:,.0f} | {r['best_val_nats_per_char']:.4f} "
            f"| {r['test_nats_per_char']:.4f} | {r['test_bits_per_char']:.3f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", default="10m", help="training wall-clock budget per recipe (default 10m)")
    parser.add_argument("--corpus", default=REF_CORPUS)
    parser.add_argument("--checkpoint-dir", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--recipe", action="append", help="textgen train flags in one string; repeat to compare")
    parser.add_argument("--json", action="store_true", help="print one JSON object per recipe")
    parser.add_argument("train_args", nargs="*", help="textgen train flags for a single recipe, after --")
    args = parser.parse_args()
    recipes = [shlex.split(r) for r in args.recipe] if args.recipe else [args.train_args]

    reports = []
    with tempfile.TemporaryDirectory() as scratch:
        for recipe in recipes:
            report = measure(recipe, args.corpus, args.time_budget, args.checkpoint_dir or scratch)
            reports.append(report)
            print(json.dumps(report) if args.json else describe(report), flush=True)
    if len(reports) > 1 and not args.json:
        print(f"\nranked by test loss ({args.time_budget} each):\n{ranking(reports)}")


if __name__ == "__main__":
    main()
