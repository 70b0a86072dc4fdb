"""Deployment: size, speed and quality of every way to ship a run, side by side in one run.

For a trained run (the teacher) and the runs made from it by ``textgen distill`` and ``textgen prune``,
each variant is measured the same way:

* size on disk and gzipped (``gzip -9`` of each file, summed): a run's float32 weights (the ``.weights.h5``
  of the model alone), or the exported directory;
* test nats/char on the run's test split, read as ``textgen evaluate`` reads it (the run's streams,
  state carried): ``textgen evaluate`` for a run, ``Sampler.score`` for an export;
* chars/s at batch 1 and batch 64 (temperature 0.8, ``--length`` characters a call for ``--seconds``);
* cold start: a fresh ``textgen sample --length 1`` process, from its start to its first character on stdout
  (median of 3);
* peak RSS of a fresh ``textgen sample --length 2000`` process (through a small launcher: see ``LAUNCHER``).

    python benchmarks/deploy.py --run wp-teacher --students wp-256u wp-128u \\
        --scratch wp-128u=wp-128-chars wp-128u=wp-128-time \\
        --pruned wp-pruned50 wp-pruned80 --checkpoint-dir /work/runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from common import timed

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "int8_cost_nats": 0.02,
    "pruned80_cost_nats": 0.03,
    "pruned80_gzip_fraction": 0.35,
    "int8_b1_chars_per_s": 20000.0,
    "litert_cold_start_s": 0.5,
}


@dataclass
class Row:
    variant: str
    kind: str  # "run" or the export's format and quantization
    bytes: int
    gzip_bytes: int
    test_nats: float
    b1_chars_per_s: float
    b64_chars_per_s: float
    cold_start_s: float
    peak_rss_mb: float


def gzip_size(path: Path) -> int:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return sum(len(gzip.compress(f.read_bytes(), 9)) for f in files)


def disk_size(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(f.stat().st_size for f in files)


def sample_command(source: list[str], length: int) -> list[str]:
    return [sys.executable, "-m", "textgen", "sample", *source, "--length", str(length), "--seed", "0"]


def first_character_seconds(source: list[str]) -> float:
    """A fresh ``textgen sample`` process: seconds from its start to its first character on stdout."""
    started = time.perf_counter()
    process = subprocess.Popen(sample_command(source, 1), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    assert process.stdout is not None
    process.stdout.read(1)
    first = time.perf_counter() - started
    process.stdout.read()
    if process.wait() != 0:
        raise RuntimeError(f"{' '.join(sample_command(source, 1))} failed ({process.returncode})")
    return first


# Started from this (large) process, a child's ru_maxrss counts the pages it was forked with: a small
# launcher starts textgen and reports the peak of textgen's own process, as /usr/bin/time -f %M does.
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss if status == 0 else -1)
"""


def peak_rss_mb(source: list[str], length: int = 2000) -> float:
    """The peak RSS (MB) of a fresh ``textgen sample --length LENGTH`` process."""
    command = sample_command(source, length)
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *command], capture_output=True, text=True, cwd=ROOT)
    kilobytes = int(out.stdout.strip() or -1)
    if kilobytes < 0:
        raise RuntimeError(f"{' '.join(command)} failed")
    return kilobytes / 1024


def throughput(generate: Callable[[int, int, int], object], batch: int, length: int, seconds: float) -> float:
    seeds = iter(range(1, 10**9))
    calls, elapsed = timed(lambda: generate(batch, length, next(seeds)), seconds, warmup=1)
    return batch * calls * length / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the teacher: a float32 run")
    parser.add_argument("--students", nargs="*", default=[], help="runs made by textgen distill from --run")
    parser.add_argument(
        "--scratch",
        nargs="*",
        default=[],
        metavar="STUDENT=RUN",
        help="a student's architecture trained from scratch (by textgen train), to compare the student with",
    )
    parser.add_argument("--pruned", nargs="*", default=[], help="runs made by textgen prune from --run")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--length", type=int, default=500, help="characters per generation call")
    parser.add_argument("--seconds", type=float, default=5.0, help="timing per speed measurement")
    parser.add_argument("--json", action="store_true", help="one JSON object per row, then the verdicts")
    args = parser.parse_args()
    checkpoint_dir = args.checkpoint_dir.resolve()

    from textgen.device import import_tensorflow

    import_tensorflow()  # quietly, before anything else imports it
    from textgen import api
    from textgen.artifact import ExportFormat, Quantize
    from textgen.config import Weights
    from textgen.evaluate import split_ids
    from textgen.genconfig import SampleConfig
    from textgen.layout import scoring_layout
    from textgen.model import build_model
    from textgen.rundirs import find_run
    from textgen.runtime import open_artifact

    teacher = find_run(checkpoint_dir, args.run)
    rows: list[Row] = []

    def measure(variant: str, kind: str, sampler: object, size_path: Path, nats: float, source: list[str]) -> None:
        def generate(batch: int, length: int, seed: int) -> object:
            return sampler.generate(["The "] * batch, SampleConfig(length=length, temperature=0.8, seed=seed))  # type: ignore[attr-defined]

        b1 = throughput(generate, 1, args.length, args.seconds)
        b64 = throughput(generate, 64, max(args.length // 8, 20), args.seconds)
        starts = [first_character_seconds(source) for _ in range(3)]
        rss = peak_rss_mb(source)
        row = Row(
            variant, kind, disk_size(size_path), gzip_size(size_path), nats, b1, b64, statistics.median(starts), rss
        )
        rows.append(row)
        print(json.dumps(asdict(row)) if args.json else _format(row), flush=True)

    if not args.json:
        print(_HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="textgen-deploy-") as scratch_dir:
        scratch = Path(scratch_dir)
        plan = [(teacher.name, "run"), (teacher.name, "litert"), (teacher.name, "litert-float16")]
        plan += [(teacher.name, "litert-int8"), (teacher.name, "savedmodel")]
        baselines = list(dict.fromkeys(pair.partition("=")[2] for pair in args.scratch))
        plan += [(name, kind) for name in args.students for kind in ("run", "litert-int8")]
        plan += [(name, "run") for name in baselines]
        plan += [(name, kind) for name in args.pruned for kind in ("litert", "litert-int8")]
        for name, kind in plan:
            run = find_run(checkpoint_dir, name)
            cfg = run.load_config()
            test_ids = split_ids(run, "test", scratch)
            layout = scoring_layout(len(test_ids), cfg.data.batch_size, cfg.data.seq_len, f"{run.name}'s test split")
            source = ["--run", run.name, "--checkpoint-dir", str(checkpoint_dir)]
            if kind == "run":
                sampler, _ = api.open_generator(checkpoint_dir=checkpoint_dir, run_name=run.name)
                weights = scratch / f"{run.name}.weights.h5"  # the model's weights alone, no optimizer state
                model = build_model(cfg.model, 1, stateful=False)
                run.load_weights(model, Weights.best)
                model.save_weights(weights)
                nats = api.evaluate(checkpoint_dir=checkpoint_dir, run_name=run.name).nats_per_char
                measure(run.name, kind, sampler, weights, nats, source)
                continue
            format, _, quantize = kind.partition("-")
            exported = api.export(
                checkpoint_dir=checkpoint_dir,
                run_name=run.name,
                format=ExportFormat(format),
                quantize=Quantize(quantize or "none"),
                path=scratch / f"{run.name}-{kind}",
            ).path
            sampler, _ = open_artifact(exported)
            total, chars = sampler.score(test_ids, layout)
            measure(run.name, kind, sampler, exported, total / chars, ["--model", str(exported)])
    verdicts = _verdicts(rows, teacher.name, args)
    for line in verdicts:
        print(json.dumps(line) if args.json else f"{line['target']}: {line['value']:.4g} ({line['verdict']})")


_HEADER = (
    f"{'variant':<22} {'kind':<16} {'MB':>6} {'gzip MB':>8} {'test nats':>9} {'b1 ch/s':>9} {'b64 ch/s':>9} "
    f"{'cold s':>7} {'RSS MB':>7}"
)


def _format(row: Row) -> str:
    return (
        f"{row.variant:<22} {row.kind:<16} {row.bytes / 1e6:>6.2f} {row.gzip_bytes / 1e6:>8.2f} {row.test_nats:>9.4f} "
        f"{row.b1_chars_per_s:>9,.0f} {row.b64_chars_per_s:>9,.0f} {row.cold_start_s:>7.2f} {row.peak_rss_mb:>7.0f}"
    )


def _verdicts(rows: list[Row], teacher: str, args: argparse.Namespace) -> list[dict]:
    def find(variant: str, kind: str) -> Row | None:
        return next((r for r in rows if r.variant == variant and r.kind == kind), None)

    out: list[dict] = []

    def verdict(target: str, value: float, ok: bool) -> None:
        out.append({"target": target, "value": value, "verdict": "met" if ok else "MISSED"})

    dense, int8 = find(teacher, "litert"), find(teacher, "litert-int8")
    if dense and int8:
        cost = int8.test_nats - dense.test_nats
        verdict("int8 cost, nats/char (<= 0.02)", cost, cost <= TARGETS["int8_cost_nats"])
        verdict("int8 batch-1 chars/s (>= 20,000)", int8.b1_chars_per_s, int8.b1_chars_per_s >= 20000)
        verdict("LiteRT int8 cold start, s (<= 0.5)", int8.cold_start_s, int8.cold_start_s <= 0.5)
    if dense and args.pruned:
        pruned = find(args.pruned[-1], "litert")
        if pruned:
            cost = pruned.test_nats - dense.test_nats
            fraction = pruned.gzip_bytes / dense.gzip_bytes
            verdict(f"{args.pruned[-1]} cost, nats/char (<= 0.03)", cost, cost <= TARGETS["pruned80_cost_nats"])
            verdict(f"{args.pruned[-1]} gzip / dense gzip (<= 0.35)", fraction, fraction <= 0.35)
    for pair in args.scratch:
        student, _, baseline = pair.partition("=")
        s, b = find(student, "run"), find(baseline, "run")
        if s and b:
            # Reported either way: the target is the same characters; the same time is the comparison's price.
            difference = s.test_nats - b.test_nats
            out.append({"target": f"{student} minus {baseline}, nats/char", "value": difference,
                        "verdict": "ahead" if difference < 0 else "behind"})  # fmt: skip
    return out


if __name__ == "__main__":
    main()
