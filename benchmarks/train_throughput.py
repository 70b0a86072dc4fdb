"""Training throughput on the reference workload (REF), measured side by side in one run.

REF: War and Peace, Embedding(V, 64) -> LSTM(512) -> Dense(V), batch 64 x 100 chars.

Each measurement runs in a fresh subprocess (TensorFlow's thread pools are fixed per
process) for a fixed wall time after warm-up, one after another:

* textgen: the real training step of ``textgen train`` (``textgen.train.build_trainer``)
  on the stateful tf.data pipeline, for each candidate configuration;
* baseline: the TensorFlow tutorial's recipe, ``model.fit`` on shuffled 101-char
  windows with a stock Keras LSTM and TensorFlow's default threads;
* the tf.data pipeline alone, and the machine's fp32 matmul rate at the LSTM
  step's shape (64x512)@(512x2048), which gives a ceiling in chars/s.

    python benchmarks/train_throughput.py            # table
    python benchmarks/train_throughput.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from common import REF, cpu_busy_seconds, cycling, ref_run_config, reference_splits, timed

# Candidate textgen configurations: (name, fast_lstm, intra-op threads, inter-op threads, XLA).
CANDIDATES = [
    ("keras-lstm, TF default threads", False, 0, 0, False),
    ("keras-lstm, 1x2 threads", False, 1, 2, False),
    ("fast-lstm, TF default threads", True, 0, 0, False),
    ("fast-lstm, 1x2 threads", True, 1, 2, False),
    ("fast-lstm, 2x1 threads", True, 2, 1, False),
    ("fast-lstm, 2x1 threads, XLA", True, 2, 1, True),
]


def flops_per_char(vocab: int) -> float:
    """Forward + backward FLOPs per character for REF (3 x the forward multiply-adds x 2)."""
    e, u = REF["embedding_dim"], REF["units"]
    return 3 * 2 * (e * 4 * u + u * 4 * u + u * vocab)


# --- measurements, each run in its own process -------------------------------------------


def measure_textgen(seconds: float, fast_lstm: bool, intra: int, inter: int, jit: bool) -> dict:
    from textgen.config import DeviceProfile
    from textgen.device import apply_profile

    profile = DeviceProfile(
        name="bench",
        precision="float32",
        batch_size=REF["batch_size"],
        intra_op_threads=intra,
        inter_op_threads=inter,
        jit_compile=jit,
        fast_lstm=fast_lstm,
    )
    apply_profile(profile)
    from textgen.data import StreamLayout, distributed_batches
    from textgen.train import build_trainer

    corpus, splits = reference_splits()
    cfg = ref_run_config(str(corpus), splits.vocab.size, profile)
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
            keras.layers.LSTM(REF["units"], return_sequences=True),
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


def measure_pipeline(seconds: float) -> dict:
    """textgen's tf.data pipeline alone: how fast it can feed batches."""
    import tensorflow as tf

    from textgen.data import StreamLayout, distributed_batches

    _, splits = reference_splits()
    batch, seq = REF["batch_size"], REF["seq_len"]
    layout = StreamLayout.of(len(splits.train), batch, seq)
    # The first timed call makes its iterator; a new pass starts when one ends.
    next_batch = cycling(distributed_batches(tf.distribute.get_strategy(), splits.train, layout))
    batches, elapsed = timed(next_batch, seconds, warmup=0)  # StreamLayout: every batch is batch x seq
    return {"chars_per_sec": batches * batch * seq / elapsed}


def measure_matmul(seconds: float) -> dict:
    """fp32 GFLOP/s of (64x512)@(512x2048), 50 chained matmuls per call to hide call overhead."""
    import tensorflow as tf

    u, b = REF["units"], REF["batch_size"]
    a = tf.random.normal([b, u])
    w = tf.random.normal([u, 4 * u]) / 40.0
    back = tf.random.normal([4 * u, u]) / 40.0

    @tf.function
    def chain(x: tf.Tensor) -> tf.Tensor:
        for _ in range(25):
            x = tf.tanh(tf.matmul(tf.matmul(x, w), back))  # 2 matmuls of the step's size
        return x

    calls, elapsed = timed(lambda: float(chain(a)[0, 0]), seconds, warmup=3)
    return {"gflops": calls * 50 * 2 * b * u * 4 * u / elapsed / 1e9}


def _child(kind: str, seconds: float, candidate: int) -> None:
    from textgen.device import import_tensorflow

    import_tensorflow()
    if kind == "textgen":
        result = measure_textgen(seconds, *CANDIDATES[candidate][1:])
    else:
        result = {"baseline": measure_baseline, "pipeline": measure_pipeline, "matmul": measure_matmul}[kind](seconds)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _run_child(kind: str, seconds: float, candidate: int = 0) -> dict:
    """Run one measurement in a subprocess; add the CPU other processes used meanwhile."""
    busy, wall = cpu_busy_seconds(), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--seconds", str(seconds), "--candidate", str(candidate)],
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured wall time per configuration")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--only-default", action="store_true", help="measure only the CPU profile's configuration")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--candidate", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seconds, args.candidate)
        return

    from textgen.device import CPU

    default = next(
        i
        for i, c in enumerate(CANDIDATES)
        if c[1:] == (CPU.fast_lstm, CPU.intra_op_threads, CPU.inter_op_threads, CPU.jit_compile)
    )
    chosen = [default] if args.only_default else range(len(CANDIDATES))
    load_before = os.getloadavg()[0]
    matmul = _run_child("matmul", min(args.seconds, 10.0))
    baseline = _run_child("baseline", args.seconds)
    pipeline = _run_child("pipeline", min(args.seconds, 5.0))
    rows = {CANDIDATES[i][0]: _run_child("textgen", args.seconds, i) for i in chosen}
    vocab = next(iter(rows.values()))["vocab"]
    ceiling = matmul["gflops"] * 1e9 / flops_per_char(vocab)
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "seconds_per_measurement": args.seconds,
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "matmul_gflops": matmul["gflops"],
        "mflop_per_char": flops_per_char(vocab) / 1e6,
        "ceiling_chars_per_sec": ceiling,
        "pipeline_chars_per_sec": pipeline["chars_per_sec"],
        "baseline": baseline,
        "textgen": {
            name: {
                **r,
                "vs_baseline": r["chars_per_sec"] / baseline["chars_per_sec"],
                "of_ceiling": r["chars_per_sec"] / ceiling,
            }
            for name, r in rows.items()
        },
        "default_profile": CANDIDATES[default][0],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"REF training throughput ({report['date']}, {report['cores']} cores, {args.seconds:.0f} s each)"
    )
    for column in ("configuration", "chars/s", "vs baseline", "% of ceiling", "peak RSS MB", "other CPU (cores)"):
        table.add_column(column, justify="right" if column != "configuration" else "left")
    table.add_row(
        "baseline: tutorial model.fit",
        f"{baseline['chars_per_sec']:,.0f}",
        "1.00x",
        f"{baseline['chars_per_sec'] / ceiling:.0%}",
        f"{baseline['peak_rss_mb']:.0f}",
        f"{baseline['other_cpu_cores']:.2f}",
    )
    for name, r in report["textgen"].items():
        mark = " (cpu profile)" if name == report["default_profile"] else ""
        table.add_row(
            f"textgen: {name}{mark}",
            f"{r['chars_per_sec']:,.0f}",
            f"{r['vs_baseline']:.2f}x",
            f"{r['of_ceiling']:.0%}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['other_cpu_cores']:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(
        f"matmul (64x512)@(512x2048) fp32: {matmul['gflops']:.0f} GFLOP/s -> ceiling {ceiling:,.0f} chars/s "
        f"at {report['mflop_per_char']:.2f} MFLOP/char; tf.data pipeline alone: {pipeline['chars_per_sec']:,.0f} chars/s; "
        f"load avg {load_before:.2f} -> {report['load_avg_1m_after']:.2f}"
    )


if __name__ == "__main__":
    main()
