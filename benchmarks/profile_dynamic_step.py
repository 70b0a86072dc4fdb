"""Where the time of dynamic evaluation's batch-1 step goes, under given thread pools.

    python benchmarks/profile_dynamic_step.py --run-dir checkpoints/2600-0
    python benchmarks/profile_dynamic_step.py --run-dir checkpoints/2600-0 --threads 2x2 --compile-whole

A process keeps its thread pools, so each setting runs in a process of its own; run them alternately (the host's
speed drifts by more than the differences). On the start of the run's test split, in segments of its
``dynamic.json`` length, it times the chain of recurrent matrix-vector products alone ((1 x U) @ (U x 4U), one a
timestep: the loop's only unavoidable work, forward and backward alike), the static step (scoring) and the
dynamic step (scoring, gradient, update) as ``textgen evaluate --dynamic`` runs them (1 x 2 threads, sampling's);
with ``--compile-whole``, both steps compiled whole with XLA.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path, help="the trained run's directory")
    parser.add_argument("--threads", default="1x2", help="intra-op x inter-op threads (default: 1x2, sampling's)")
    parser.add_argument("--segments", type=int, default=400, help="segments timed (default: 400)")
    parser.add_argument("--compile-whole", action="store_true", help="compile both steps whole with XLA")
    args = parser.parse_args()
    intra, inter = (int(n) for n in args.threads.split("x"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    from textgen.checkpoint import Run
    from textgen.config import DynamicConfig, Split, Weights
    from textgen.dynamic import DynamicEvaluator, mean_squares, open_evaluator, read_settings, segments
    from textgen.evaluate import split_ids
    from textgen.model import lstm_layers
    from textgen.scoring import compile_eval_step

    run = Run(args.run_dir.resolve())
    cfg = run.load_config()
    settings = read_settings(run) or DynamicConfig()
    length = settings.segment_len
    evaluator = open_evaluator(run, Weights.best, length)
    if args.compile_whole:  # the same model and MS (the run's cache), its steps compiled whole
        evaluator = DynamicEvaluator(evaluator.model, dataclasses.replace(evaluator.profile, jit_compile=True))
        evaluator.set_mean_squares(mean_squares(run, Weights.best, evaluator, length))
    model, profile = evaluator.model, evaluator.profile
    with tempfile.TemporaryDirectory(prefix="textgen-profile-") as scratch:
        test = np.asarray(split_ids(run, Split.test, Path(scratch)), np.int32)
    test_segments = -(-(len(test) - 1) // length)
    ids = test[: args.segments * length + 1]
    inputs, targets = segments(ids, length)

    recurrent = lstm_layers(model)[0].cell.recurrent_kernel
    units = recurrent.shape[0]

    @tf.function(jit_compile=True, autograph=False)
    def matvec_chain(h: tf.Tensor) -> tf.Tensor:
        def step(t: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return t + 1, tf.tanh(tf.matmul(h, recurrent)[:, :units])

        return tf.while_loop(lambda t, _: t < length, step, (tf.constant(0), h))[1]

    def ms_per_segment(call: Callable[[int], tf.Tensor], count: int) -> float:
        call(0)
        started = time.perf_counter()
        for i in range(count):
            result = call(i)
        float(tf.reduce_sum(result))
        return (time.perf_counter() - started) / count * 1000

    h0 = tf.fill([1, units], 0.1)
    chain = ms_per_segment(lambda _: matvec_chain(h0), len(inputs))
    eval_step = compile_eval_step(model, profile)
    static = ms_per_segment(
        lambda i: eval_step(tf.constant(inputs[i : i + 1]), tf.constant(targets[i : i + 1])), len(inputs)
    )
    evaluator.restore()
    evaluator.segment_losses(ids[: length + 1], settings)  # compiled before it is timed
    started = time.perf_counter()
    evaluator.segment_losses(ids, settings)
    dynamic = (time.perf_counter() - started) / len(inputs) * 1000
    layers = len(lstm_layers(model))
    floor = chain * 2 * layers  # each layer's chain forward and its transpose backward
    print(f"{run.name}: {layers} x {units}{' layer-normalized' if cfg.model.layer_norm else ''}, threads "
          f"{intra}x{inter}{', steps compiled whole' if args.compile_whole else ''}; {len(inputs)} segments of {length}")  # fmt: skip
    print(f"  matvec chain    {chain:7.2f} ms a segment ({chain / length * 1000:.0f} us a matvec)")
    print(f"  static step     {static:7.2f} ms a segment")
    print(f"  dynamic step    {dynamic:7.2f} ms a segment; the chains' floor {floor:.2f} ms ({floor / dynamic:.0%})")
    print(
        f"  the whole test split dynamically: about {dynamic * test_segments / 1000:.0f} s ({test_segments:,} segments)"
    )


if __name__ == "__main__":
    main()
