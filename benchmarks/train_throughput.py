"""Training throughput on the reference workload (REF), measured side by side in one run.

REF: War and Peace, Embedding(V, 64) -> LSTM(512) -> Dense(V), batch 64 x 100 chars.

Each measurement runs in a fresh subprocess (TensorFlow's thread pools are fixed per
process) for a fixed wall time after warm-up, one after another:

* textgen: the real training step of ``textgen train`` (``textgen.training.step.build_trainer``)
  on the stateful tf.data pipeline, for each candidate configuration;
* ``textgen train`` itself, the command, for max(120 s, 6 x --seconds) on a fresh run: the
  chars/s its history records, against the cpu profile's step above;
* baseline: the TensorFlow tutorial's recipe, ``model.fit`` on shuffled 101-char
  windows with a stock Keras LSTM and TensorFlow's default threads;
* PyTorch: the char-rnn recipe (``torch.nn.LSTM``, Adam 2e-3, clipping at norm 5, the same stateful
  streams and shapes, threads set to the core count), when ``torch`` is importable
  (``pip install torch`` in the same environment; textgen itself does not depend on it);
* the tf.data pipeline alone, and the machine's fp32 matmul rate at the LSTM step's shape
  (64x512)@(512x2048) and at its peak (2048x2048)@(2048x2048), which give ceilings in chars/s.

    python benchmarks/train_throughput.py               # table
    python benchmarks/train_throughput.py --layers 2    # 2 x 512
    python benchmarks/train_throughput.py --json        # one JSON object
    python benchmarks/train_throughput.py --alternate torch,6 --pairs 3 --layers 2
        # two measurements in turn (torch, cli, or a textgen candidate's index), ABBA..., with each pair's ratio:
        # this host drifts 10-15% minute to minute, which a ratio of neighbours mostly cancels
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import numpy as np
from common import REF, REF_CORPUS, cpu_busy_seconds, cycling, ref_run_config, reference_splits, timed

if TYPE_CHECKING:
    from charrnn_torch import State

# Candidate textgen configurations: (name, fast_lstm, intra-op threads, inter-op threads, XLA, the fast LSTM's
# timesteps per loop iteration: None for textgen.fastlstm.UNROLL, --weight-drop).
CANDIDATES = [
    ("keras-lstm, TF default threads", False, 0, 0, False, None, 0.0),
    ("keras-lstm, 1x2 threads", False, 1, 2, False, None, 0.0),
    ("fast-lstm, TF default threads", True, 0, 0, False, None, 0.0),
    ("fast-lstm, 1x2 threads", True, 1, 2, False, None, 0.0),
    ("fast-lstm, 2x1 threads, 1 step per loop iteration", True, 2, 1, False, 1, 0.0),
    ("fast-lstm, 2x1 threads, 8 steps per loop iteration", True, 2, 1, False, 8, 0.0),
    ("fast-lstm, 2x1 threads", True, 2, 1, False, None, 0.0),
    ("fast-lstm, 2x1 threads, XLA", True, 2, 1, True, None, 0.0),
    # Two ops at once: a layer's weight-gradient matmuls beside the layer below's backward recurrence.
    ("fast-lstm, 2x2 threads", True, 2, 2, False, None, 0.0),
    # The cpu profile with weight-drop: a mask drawn and applied to each recurrent kernel per update.
    ("fast-lstm, 2x1 threads, weight-drop 0.25", True, 2, 1, False, None, 0.25),
]


def flops_per_char(vocab: int) -> float:
    """Forward + backward FLOPs per character for REF (3 x the forward multiply-adds x 2)."""
    e, u, layers = REF["embedding_dim"], REF["units"], REF["layers"]
    lstm = (e + u) * 4 * u + (layers - 1) * (u + u) * 4 * u
    return 3 * 2 * (lstm + u * vocab)


# --- measurements, each run in its own process -------------------------------------------


def measure_textgen(
    seconds: float, fast_lstm: bool, intra: int, inter: int, jit: bool, unroll: int | None, weight_drop: float
) -> dict:
    import dataclasses

    from textgen import fastlstm
    from textgen.config import Device, DeviceProfile
    from textgen.device import apply_profile

    fastlstm.UNROLL = unroll or fastlstm.UNROLL  # read when the step is traced

    profile = DeviceProfile(
        name=Device.cpu,
        precision="float32",
        batch_size=REF["batch_size"],
        intra_op_threads=intra,
        inter_op_threads=inter,
        jit_compile=jit,
        fast_lstm=fast_lstm,
    )
    apply_profile(profile)
    from textgen.data import distributed_batches
    from textgen.layout import StreamLayout
    from textgen.training.step import build_trainer

    corpus, splits = reference_splits()
    cfg = ref_run_config(str(corpus), splits.vocab.size, profile)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, weight_drop=weight_drop))
    data = cfg.data
    trainer = build_trainer(cfg)
    layout = StreamLayout.of(len(splits.train), data.batch_size, data.seq_len)
    next_batch = cycling(distributed_batches(trainer.strategy, splits.train, layout))
    steps, elapsed = timed(lambda: float(trainer.train_step(*next_batch())), seconds, warmup=3)
    return {
        "chars_per_sec": steps * data.batch_size * data.seq_len / elapsed,
        "steps": steps,
        "vocab": splits.vocab.size,
    }


def measure_cli(seconds: float) -> dict:
    """``textgen train`` itself on REF (``--device cpu``, a fresh run): the chars/s of its training, as its
    history records them (the epoch's training time, first batch and its tracing included)."""
    with tempfile.TemporaryDirectory() as runs:
        command = [sys.executable, "-m", "textgen", "train", REF_CORPUS, "--device", "cpu", "--json"]
        command += ["--checkpoint-dir", runs, "--run", "bench", "--time-budget", f"{seconds:.0f}s", "--epochs", "1"]
        command += [f"--{key.replace('_', '-')}={value}" for key, value in REF.items()]
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"textgen train failed:\n{out.stderr[-3000:]}")
        events = [json.loads(line) for line in out.stdout.splitlines()]
        epoch = next(e for e in events if e["event"] == "epoch")
    return {
        "chars_per_sec": epoch["chars_per_sec"],
        "steps": epoch["batches"],
        "seconds": epoch["seconds"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def measure_baseline(seconds: float) -> dict:
    """The TensorFlow text-generation tutorial's recipe on REF."""
    import keras
    import tensorflow as tf

    _, splits = reference_splits()
    vocab, train = splits.vocab, np.asarray(splits.train, dtype=np.int32)  # in memory, as the tutorial holds it
    seq, batch = REF["seq_len"], REF["batch_size"]
    windows = tf.data.Dataset.from_tensor_slices(train).batch(seq + 1, drop_remainder=True)
    dataset = (
        windows.map(lambda w: (w[:-1], w[1:]))
        .shuffle(10000)
        .batch(batch, drop_remainder=True)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(vocab.size, REF["embedding_dim"]),
            *(keras.layers.LSTM(REF["units"], return_sequences=True) for _ in range(REF["layers"])),
            keras.layers.Dense(vocab.size),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index: int, logs: dict | None = None) -> None:
            if batch_index == 2:  # warm-up done
                self.started, self.first = time.perf_counter(), batch_index
            elif batch_index > 2 and time.perf_counter() - self.started >= seconds:
                self.done = batch_index - self.first
                self.elapsed = time.perf_counter() - self.started
                self.model.stop_training = True

    clock = Clock()
    model.fit(dataset, epochs=1, steps_per_epoch=10**6, callbacks=[clock], verbose=0)
    return {"chars_per_sec": clock.done * batch * seq / clock.elapsed, "steps": clock.done}


def measure_torch(seconds: float) -> dict:
    """The PyTorch char-rnn recipe on REF: Embedding -> torch.nn.LSTM -> Linear, Adam 2e-3, clipping at norm 5, on
    the same stateful streams (the state carried from batch to batch, detached), threads set to the core count."""
    import torch
    from charrnn_torch import recipe, train_step

    from textgen.layout import StreamLayout

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    _, splits = reference_splits()
    vocab, batch, seq = splits.vocab.size, REF["batch_size"], REF["seq_len"]
    layout = StreamLayout.of(len(splits.train), batch, seq)
    model, optimizer = recipe(vocab)
    state: State | None = None
    batches = cycling(range(layout.batches))

    def step() -> float:
        nonlocal state
        loss, state = train_step(model, optimizer, *layout.batch(splits.train, batches()), state)
        return float(loss)

    steps, elapsed = timed(step, seconds, warmup=3)
    return {"chars_per_sec": steps * batch * seq / elapsed, "steps": steps, "version": torch.__version__}


def measure_pipeline(seconds: float) -> dict:
    """textgen's tf.data pipeline alone: how fast it can feed batches."""
    import tensorflow as tf

    from textgen.data import distributed_batches
    from textgen.layout import StreamLayout

    _, splits = reference_splits()
    batch, seq = REF["batch_size"], REF["seq_len"]
    layout = StreamLayout.of(len(splits.train), batch, seq)
    # The first timed call makes its iterator; a new pass starts when one ends.
    next_batch = cycling(distributed_batches(tf.distribute.get_strategy(), splits.train, layout))
    batches, elapsed = timed(next_batch, seconds, warmup=0)  # StreamLayout: every batch is batch x seq
    return {"chars_per_sec": batches * batch * seq / elapsed}


def measure_matmul(seconds: float) -> dict:
    """fp32 GFLOP/s of (64x512)@(512x2048), 50 chained matmuls per call to hide call overhead, and of
    (2048x2048)@(2048x2048), the machine's peak."""
    import tensorflow as tf

    u, b = REF["units"], REF["batch_size"]
    a = tf.random.normal([b, u])
    w = tf.random.normal([u, 4 * u]) / 40.0
    back = tf.random.normal([4 * u, u]) / 40.0
    square = tf.random.normal([2048, 2048]) / 50.0

    @tf.function
    def chain(x: tf.Tensor) -> tf.Tensor:
        for _ in range(25):
            x = tf.tanh(tf.matmul(tf.matmul(x, w), back))  # 2 matmuls of the step's size
        return x

    @tf.function
    def big(x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, square)

    calls, elapsed = timed(lambda: float(chain(a)[0, 0]), seconds / 2, warmup=3)
    peak_calls, peak_elapsed = timed(lambda: float(big(square)[0, 0]), seconds / 2, warmup=2)
    return {
        "gflops": calls * 50 * 2 * b * u * 4 * u / elapsed / 1e9,
        "peak_gflops": peak_calls * 2 * 2048**3 / peak_elapsed / 1e9,
    }


def _child(kind: str, seconds: float, candidate: int, layers: int) -> None:
    from textgen.device import import_tensorflow

    REF["layers"] = layers
    if kind == "torch":  # without TensorFlow in the process
        result = measure_torch(seconds)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    import_tensorflow()
    if kind == "textgen":
        result = measure_textgen(seconds, *CANDIDATES[candidate][1:])
    else:
        measure = {
            "baseline": measure_baseline,
            "pipeline": measure_pipeline,
            "matmul": measure_matmul,
            "cli": measure_cli,
        }
        result = measure[kind](seconds)
    result.setdefault("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(result))


def _run_child(kind: str, seconds: float, candidate: int = 0) -> dict:
    """Run one measurement in a subprocess; add the CPU other processes used meanwhile."""
    busy, wall = cpu_busy_seconds(), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = ["--child", kind, "--seconds", str(seconds), "--candidate", str(candidate), "--layers", str(REF["layers"])]
    out = subprocess.run(
        [sys.executable, __file__, *child],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} measurement failed:\n{out.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    elapsed = time.perf_counter() - wall
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["other_cpu_cores"] = max(0.0, (cpu_busy_seconds() - busy - ours) / elapsed)
    return result


def _measure(kind: str, seconds: float) -> dict:
    """One measurement named as ``--alternate`` names it: torch, cli, or a textgen candidate's index."""
    if kind.isdigit():
        return _run_child("textgen", seconds, int(kind))
    return _run_child(kind, max(120.0, 6 * seconds) if kind == "cli" else seconds)


def alternate(first: str, second: str, pairs: int, seconds: float) -> dict:
    """``first`` and ``second`` measured in turn ``pairs`` times, which goes first alternating: each pair's
    ratio second / first, and their mean."""
    runs: dict[str, list[float]] = {first: [], second: []}
    for pair in range(pairs):
        for kind in (first, second) if pair % 2 == 0 else (second, first):
            runs[kind].append(_measure(kind, seconds)["chars_per_sec"])
    ratios = [b / a for a, b in zip(runs[first], runs[second], strict=True)]
    return {
        "first": first,
        "second": second,
        "chars_per_sec": runs,
        "ratios": ratios,
        "mean_ratio": float(np.mean(ratios)),
    }


def _alternatives(value: str) -> tuple[str, str]:
    """``--alternate``'s two measurements, or one line saying what it takes."""
    kinds = value.split(",")
    known = {"torch", "cli", *map(str, range(len(CANDIDATES)))}
    if len(kinds) != 2 or kinds[0] == kinds[1] or not set(kinds) <= known:
        raise SystemExit(
            f"--alternate takes two different measurements, A,B, each torch, cli or a candidate's index "
            f"0-{len(CANDIDATES) - 1} (got {value!r})"
        )
    return kinds[0], kinds[1]


def _name(kind: str) -> str:
    return f"textgen: {CANDIDATES[int(kind)][0]}" if kind.isdigit() else {"cli": "textgen train"}.get(kind, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured wall time per configuration")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--only-default", action="store_true", help="measure only the CPU profile's configuration")
    parser.add_argument("--layers", type=int, default=1, help="LSTM layers of 512 (REF: 1)")
    parser.add_argument("--alternate", help="A,B: measure only these two in turn (torch, cli, or a candidate's index)")
    parser.add_argument("--pairs", type=int, default=2, help="with --alternate: how many A/B pairs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--candidate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seconds, args.candidate, args.layers)
        return
    REF["layers"] = args.layers
    if args.alternate:
        first, second = _alternatives(args.alternate)
        result = {"layers": args.layers, "seconds_per_measurement": args.seconds}
        result |= alternate(first, second, args.pairs, args.seconds)
        if args.json:
            print(json.dumps(result, indent=2))
            return
        for a, b, ratio in zip(
            result["chars_per_sec"][first], result["chars_per_sec"][second], result["ratios"], strict=True
        ):
            print(f"{_name(first)} {a:,.0f}  {_name(second)} {b:,.0f}  ratio {ratio:.3f}")
        print(
            f"{args.layers} x {REF['units']}: {_name(second)} / {_name(first)} = {result['mean_ratio']:.3f} on average"
        )
        return

    from textgen.device import CPU

    default = next(
        i
        for i, c in enumerate(CANDIDATES)
        if c[1:] == (CPU.fast_lstm, CPU.intra_op_threads, CPU.inter_op_threads, CPU.jit_compile, None, 0.0)
    )
    chosen = [default] if args.only_default else range(len(CANDIDATES))
    load_before = os.getloadavg()[0]
    matmul = _run_child("matmul", min(args.seconds, 10.0))
    baseline = _run_child("baseline", args.seconds)
    pipeline = _run_child("pipeline", min(args.seconds, 5.0))
    torch_row = _run_child("torch", args.seconds) if importlib.util.find_spec("torch") else None
    rows = {CANDIDATES[i][0]: _run_child("textgen", args.seconds, i) for i in chosen}
    # The command's history counts its first batch, which traces and compiles the step (~3.4 s on REF): long enough
    # that this is a small part of it, as in any real run.
    command = _run_child("cli", max(120.0, 6 * args.seconds))
    vocab = next(iter(rows.values()))["vocab"]
    ceiling = matmul["gflops"] * 1e9 / flops_per_char(vocab)
    peak = matmul["peak_gflops"] * 1e9 / flops_per_char(vocab)
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "seconds_per_measurement": args.seconds,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "layers": REF["layers"],
        "matmul_gflops": matmul["gflops"],
        "peak_matmul_gflops": matmul["peak_gflops"],
        "peak_ceiling_chars_per_sec": peak,
        "torch": torch_row,
        "mflop_per_char": flops_per_char(vocab) / 1e6,
        "ceiling_chars_per_sec": ceiling,
        "pipeline_chars_per_sec": pipeline["chars_per_sec"],
        "baseline": baseline,
        "textgen": {
            name: {
                **r,
                "vs_baseline": r["chars_per_sec"] / baseline["chars_per_sec"],
                "vs_torch": r["chars_per_sec"] / torch_row["chars_per_sec"] if torch_row else None,
                "of_ceiling": r["chars_per_sec"] / ceiling,
                "of_peak": r["chars_per_sec"] / peak,
            }
            for name, r in rows.items()
        },
        "default_profile": CANDIDATES[default][0],
        "train_command": {
            **command,
            "vs_step": command["chars_per_sec"] / rows[CANDIDATES[default][0]]["chars_per_sec"],
            "vs_torch": command["chars_per_sec"] / torch_row["chars_per_sec"] if torch_row else None,
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    layers = f"{REF['layers']} x {REF['units']}"
    table = Table(
        title=f"REF training throughput, {layers} ({report['date']}, {report['cores']} cores, {args.seconds:.0f} s each)"
    )
    columns = ("configuration", "chars/s", "vs baseline", "vs PyTorch", "% of step ceiling", "% of peak")
    for column in (*columns, "peak RSS MB", "other CPU (cores)"):
        table.add_column(column, justify="right" if column != "configuration" else "left")
    others = [("baseline: tutorial model.fit", baseline)]
    if torch_row:
        others.append((f"PyTorch {torch_row['version']}: char-rnn recipe", torch_row))
    measured = [*others, *((f"textgen: {name}", r) for name, r in report["textgen"].items())]
    measured.append(("textgen train, the command (cpu profile)", command))
    for name, r in measured:
        mark = " (cpu profile)" if name == f"textgen: {report['default_profile']}" else ""
        table.add_row(
            f"{name}{mark}",
            f"{r['chars_per_sec']:,.0f}",
            f"{r['chars_per_sec'] / baseline['chars_per_sec']:.2f}x",
            f"{r['chars_per_sec'] / torch_row['chars_per_sec']:.2f}x" if torch_row else "-",
            f"{r['chars_per_sec'] / ceiling:.0%}",
            f"{r['chars_per_sec'] / peak:.0%}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['other_cpu_cores']:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"matmul (64x512)@(512x2048) fp32: {matmul['gflops']:.0f} GFLOP/s -> step ceiling {ceiling:,.0f} chars/s; "
        f"(2048x2048)@(2048x2048): {matmul['peak_gflops']:.0f} GFLOP/s -> peak ceiling {peak:,.0f} chars/s "
        f"at {report['mflop_per_char']:.2f} MFLOP/char; tf.data pipeline alone: {pipeline['chars_per_sec']:,.0f} chars/s; "
        f"load avg {load_before:.2f} -> {report['load_avg_1m_after']:.2f}"
    )
    console.print(
        f"textgen train, the command, {command['seconds']:.0f} s: {command['chars_per_sec']:,.0f} chars/s, "
        f"{report['train_command']['vs_step']:.0%} of the cpu profile's step measured above"
    )


if __name__ == "__main__":
    main()
