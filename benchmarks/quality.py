"""Model quality for a recipe: train on War and Peace for a fixed wall-clock budget, score the test split.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/quality.py --time-budget 10m -- --units 512
    ... --json

Everything after ``--`` goes to ``textgen train`` as it is (units, layers, embedding, dropout,
batch, sequence length, learning rate, ...). The run is written under a temporary
checkpoint directory unless ``--checkpoint-dir`` is given. Prints test nats/char and
bits/char, the epochs done and the training chars/s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile


def textgen(*args: str) -> list[dict]:
    """Run a textgen command with --json; its JSON lines (stops the benchmark if it fails)."""
    done = subprocess.run([sys.executable, "-m", "textgen", *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"textgen {args[0]} failed: {done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-budget", default="10m", help="training wall-clock budget (default 10m)")
    parser.add_argument("--corpus", default="2600-0.txt")
    parser.add_argument("--checkpoint-dir", help="keep the run here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("train_args", nargs="*", help="more textgen train flags, after --")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint_dir = args.checkpoint_dir or scratch
        lines = textgen(
            "train", args.corpus, "--device", "cpu", "--time-budget", args.time_budget,
            "--checkpoint-dir", checkpoint_dir, *args.train_args,
        )  # fmt: skip
        epochs = [line for line in lines if line.get("event") == "epoch"]
        done = lines[-1]
        scored = textgen("evaluate", "--run", done["run"], "--checkpoint-dir", checkpoint_dir, "--split", "test")[0]
    batches = sum(e["batches"] for e in epochs)
    report = {
        "recipe": args.train_args,
        "time_budget": args.time_budget,
        "epochs": done["epochs"],
        "batches": batches,
        "chars_per_sec": sum(e["chars_per_sec"] * e["batches"] for e in epochs) / max(batches, 1),
        "best_val_nats_per_char": done["best_val_loss"],
        "test_nats_per_char": scored["nats_per_char"],
        "test_bits_per_char": scored["bits_per_char"],
        "test_chars": scored["chars"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"recipe {' '.join(args.train_args) or '(defaults)'}, budget {args.time_budget}: "
        f"{report['epochs']} epochs at {report['chars_per_sec']:,.0f} chars/s; "
        f"test {report['test_nats_per_char']:.4f} nats/char = {report['test_bits_per_char']:.4f} bits/char "
        f"({report['test_chars']:,} chars); best validation {report['best_val_nats_per_char']:.4f} nats/char"
    )


if __name__ == "__main__":
    main()
