"""Model quality for recipes: train on War and Peace for a fixed wall-clock budget, score the test split.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m -- --units 512
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m \\
        --recipe "" --recipe "--lr 0.004" --recipe "--layers 2 --dropout 0.2" --recipe=--layer-norm
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m 20m 30m 60m   # a frontier

With several budgets, each recipe trains once per budget (a run annealed over that budget, as a user would train it)
and a frontier table sets its test loss beside the PyTorch char-rnn recipe's at the same budgets (measured on
another host, at 20.5k chars/s; this host's chars/s is in the table).

Everything after ``--`` (or each ``--recipe``, a quoted list of flags; "" for the defaults) goes
to ``textgen train`` as it is: units, layers, embedding, dropout, batch, sequence length, learning
rate and schedule, clipping. A recipe of one bare flag needs the ``=`` (``--recipe=--layer-norm``), or argparse
takes the flag for one of its own. Recipes run one after another, each in its own process with the
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

from textgen.durations import parse_duration

# The PyTorch char-rnn recipe (1 x 512, Adam 2e-3 halved every 5 epochs, clip 5, batch 64 x 100) on the same
# split and 2 cores, by budget in seconds: the reference figures (docs/quality.md), from a host where it trained at
# 20.5k chars/s; the run behind them is not available.
PYTORCH_CHAR_RNN = {600.0: 1.298, 1200.0: 1.231, 1800.0: 1.222, 3600.0: 1.217}
PYTORCH_CHARS_PER_SEC = 20_500


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


def frontier(reports: list[dict]) -> str:
    """A markdown table of one recipe's reports at several budgets, beside the PyTorch char-rnn's."""
    rows = [
        "| budget | epochs | chars/s | test nats/char | reference PyTorch char-rnn | difference |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(reports, key=lambda r: parse_duration(r["time_budget"])):
        reference = PYTORCH_CHAR_RNN.get(parse_duration(r["time_budget"]))
        theirs, gap = (f"{reference:.3f}", f"{r['test_nats_per_char'] - reference:+.4f}") if reference else ("-", "-")
        rows.append(
            f"| {r['time_budget']} | {r['epochs']} | {r['chars_per_sec']:,.0f} | {r['test_nats_per_char']:.4f} "
            f"| {theirs} | {gap} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--time-budget", nargs="+", default=["10m"], help="training wall-clock budget per recipe; several: a frontier"
    )
    parser.add_argument("--corpus", default=REF_CORPUS)
    parser.add_argument("--checkpoint-dir", help="keep the runs here (default: a temporary directory)")
    parser.add_argument(
        "--recipe",
        action="append",
        help="textgen train flags in one string (one bare flag: --recipe=--layer-norm); repeat to compare",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per recipe")
    parser.add_argument("train_args", nargs="*", help="textgen train flags for a single recipe, after --")
    args = parser.parse_args()
    recipes = [shlex.split(r) for r in args.recipe] if args.recipe else [args.train_args]

    reports: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for budget in args.time_budget:
            for i, recipe in enumerate(recipes):
                report = measure(recipe, args.corpus, budget, args.checkpoint_dir or scratch)
                reports[i, budget] = report
                print(json.dumps(report) if args.json else describe(report), flush=True)
    if args.json:
        return
    if len(recipes) > 1:
        for budget in args.time_budget:
            ranked = ranking([reports[i, budget] for i in range(len(recipes))])
            print(f"\nranked by test loss ({budget} each):\n{ranked}")
    if len(args.time_budget) > 1:
        for i, recipe in enumerate(recipes):
            table = frontier([reports[i, budget] for budget in args.time_budget])
            print(
                f"\nfrontier of {' '.join(recipe) or '(defaults)'} (PyTorch at {PYTORCH_CHARS_PER_SEC:,} chars/s):\n{table}"
            )


if __name__ == "__main__":
    main()
