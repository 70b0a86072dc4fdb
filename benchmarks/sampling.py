"""Sampling speed: textgen's compiled generator against the tutorials' one-step loop, in one run.

Both generate from the same trained weights (one checkpoint, the latest run by default):

* textgen: ``textgen.sampling.Generator`` (the whole loop compiled, ``chunk`` steps per call);
* naive: what most tutorials do: a Keras one-step model with explicit states (Embedding ->
  LSTM(return_sequences=True, return_state=True) called with ``initial_state=[h, c]`` -> Dense)
  given the training model's weights, a ``tf.function`` one-step function sampling with
  ``tf.random.categorical``, and a Python loop calling it once per character.

Measured: characters per second at batch 1 and batch 64 (``--length`` characters per call,
repeated for ``--seconds`` after a warm-up call), and the time to the first character, with the
model load included (load, build, first call) and excluded (the model loaded and warm: what a
REPL user waits after pressing Enter). TensorFlow's import and Keras' one-time start-up (one
model built and loaded before any timing) are timed apart and not counted.

    python benchmarks/sampling.py                                   # latest run in ./checkpoints
    python benchmarks/sampling.py --run war-and-peace --seconds 10 --json
    python benchmarks/sampling.py --frequency-penalty 0.01   # also the penalized loop (textgen_penalized_b1, _b64)
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common import timed

if TYPE_CHECKING:
    import keras
    import numpy as np
    import tensorflow as tf

    from textgen.config import ModelConfig

TARGETS = {"textgen_b1_vs_naive_b1": 10.0, "textgen_b64_vs_naive_b1": 50.0, "first_char_loaded_ms": 100.0}


def first_char_ms(call: Callable[[], object], repeats: int = 10) -> float:
    """Median milliseconds of ``call`` (after one warm-up call)."""
    call()
    return 1000 * statistics.median(timed(call, 0.0, warmup=0)[1] for _ in range(repeats))


def throughput(generate: Callable[[int, int], object], batch: int, length: int, seconds: float) -> dict:
    """``generate(length, seed)`` repeated for ``seconds`` after a short warm-up call."""
    generate(min(length, 20), 0)
    seeds = itertools.count(1)  # the n-th timed call draws with seed n
    calls, elapsed = timed(lambda: generate(length, next(seeds)), seconds, warmup=0)
    steps = calls * length
    return {
        "batch": batch,
        "chars_per_s": batch * steps / elapsed,
        "ms_per_char": 1000 * elapsed / (batch * steps),
        "ms_per_step": 1000 * elapsed / steps,  # one character of every sequence
        "calls": calls,
        "seconds": elapsed,
    }


class NaiveSampler:
    """The tutorials' pattern: a one-step Keras model and a Python loop, one call per character."""

    def __init__(self, cfg: ModelConfig, weights: list[np.ndarray], temperature: float) -> None:
        import keras
        import numpy as np
        import tensorflow as tf

        from textgen.model import LayerNormLSTMCell
        from textgen.vocab import UNKNOWN_ID

        ids = keras.Input(shape=(None,), dtype="int32")
        states_in = [keras.Input(shape=(cfg.units,)) for _ in range(2 * cfg.layers)]
        x, states_out = keras.layers.Embedding(cfg.vocab_size, cfg.embedding_dim)(ids), []
        for i in range(cfg.layers):
            if cfg.layer_norm:  # textgen's own cell: Keras has no layer-normalized LSTM
                lstm = keras.layers.RNN(LayerNormLSTMCell(cfg.units), return_sequences=True, return_state=True)
            else:
                lstm = keras.layers.LSTM(cfg.units, return_sequences=True, return_state=True)
            x, h, c = lstm(x, initial_state=states_in[2 * i : 2 * i + 2])
            states_out += [h, c]
        logits = keras.layers.Dense(cfg.vocab_size)(x)
        self.model = keras.Model([ids, *states_in], [logits, *states_out])
        self.model.set_weights(weights)
        self.units, self.layers, self.np, self.tf = cfg.units, cfg.layers, np, tf
        mask = np.zeros(cfg.vocab_size, np.float32)
        mask[UNKNOWN_ID] = -np.inf  # as the tutorial's prediction mask for [UNK]
        self.mask, self.temperature = tf.constant(mask), tf.constant(temperature, tf.float32)
        state_spec = tuple(tf.TensorSpec([None, cfg.units], tf.float32) for _ in range(2 * cfg.layers))
        self.one_step = tf.function(self._one_step, input_signature=[tf.TensorSpec([None, None], tf.int32), state_spec])

    def _one_step(self, ids: tf.Tensor, states: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        logits, *states = self.model([ids, *states], training=False)
        logits = logits[:, -1, :] / self.temperature + self.mask
        return self.tf.cast(self.tf.random.categorical(logits, 1), self.tf.int32), tuple(states)

    def generate(self, prompt_ids: np.ndarray, batch: int, length: int) -> np.ndarray:
        """``length`` ids per sequence: the prompt is read by the first call, then one call per character."""
        ids = self.tf.constant(self.np.tile(prompt_ids, [batch, 1]), self.tf.int32)
        states = tuple(self.tf.zeros([batch, self.units]) for _ in range(2 * self.layers))
        out = []
        for _ in range(length):
            ids, states = self.one_step(ids, states)
            out.append(ids)
        return self.np.concatenate([o.numpy() for o in out], axis=1)


def check_same_model(training_model: keras.Model, naive: NaiveSampler, prompt_ids: np.ndarray) -> None:
    """Both samplers must compute the same logits, or the comparison means nothing."""
    import numpy as np

    states = [np.zeros([1, naive.units], np.float32)] * (2 * naive.layers)
    expected = training_model(prompt_ids[None, :]).numpy()
    got = naive.model([prompt_ids[None, :], *states])[0].numpy()
    if not np.allclose(got, expected, atol=1e-4):
        raise SystemExit("the naive one-step model does not reproduce the training model's logits")


def measure(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    from textgen.device import configure_for_inference, import_tensorflow

    import_tensorflow()  # as the CLI does: no C++ start-up chatter
    profile = configure_for_inference()  # as textgen sample and repl do; both samplers share the pools
    import keras
    import numpy as np
    import tensorflow as tf

    from textgen.errors import TextgenError
    from textgen.genconfig import SampleConfig
    from textgen.model import build_model
    from textgen.rundirs import find_run
    from textgen.sampling import Generator
    from textgen.vocab import UNKNOWN_ID

    import_s = time.perf_counter() - started
    tf.matmul(tf.ones([8, 8]), tf.ones([8, 8])).numpy()  # start TensorFlow's runtime outside the timings
    tf.random.set_seed(0)
    try:
        run = find_run(args.checkpoint_dir, args.run)
    except TextgenError as exc:
        raise SystemExit(f"error: {exc}") from None
    settings = SampleConfig(length=args.length, temperature=args.temperature, seed=0)
    cfg = run.load_config().model

    # Keras' first model build and load costs more than later ones: pay it untimed, for both alike.
    start = time.perf_counter()
    run.load_weights(build_model(cfg, batch_size=1, stateful=False))
    keras_first_load_ms = 1000 * (time.perf_counter() - start)

    # Time to the first character, model load included: textgen, then the naive pattern.
    start = time.perf_counter()
    generator = Generator.from_run(run)
    next(generator.stream([args.prompt], settings))  # the first piece; the stream is dropped, the rest never made
    textgen_load_ms = 1000 * (time.perf_counter() - start)

    prompt_ids = generator.vocab.encode(args.prompt)
    prompt_ids = prompt_ids[prompt_ids != UNKNOWN_ID]
    if not prompt_ids.size:
        raise SystemExit(f"--prompt {args.prompt!r} has no character of the run's vocabulary")
    start = time.perf_counter()
    training_model = build_model(cfg, batch_size=1, stateful=False)
    run.load_weights(training_model)
    naive = NaiveSampler(cfg, training_model.get_weights(), args.temperature)
    naive.generate(prompt_ids, 1, 1)
    naive_load_ms = 1000 * (time.perf_counter() - start)
    check_same_model(training_model, naive, prompt_ids)

    # The same, model loaded and warm.
    def textgen_first() -> None:
        next(generator.stream([args.prompt], settings))

    textgen_first_ms = first_char_ms(textgen_first)
    naive_first_ms = first_char_ms(lambda: naive.generate(prompt_ids, 1, 1))

    def textgen_generate(batch: int, frequency_penalty: float = 0.0) -> Callable[[int, int], object]:
        return lambda length, seed: generator.generate(
            [args.prompt] * batch,
            SampleConfig(length=length, temperature=args.temperature, seed=seed, frequency_penalty=frequency_penalty),
        )

    def naive_generate(batch: int) -> Callable[[int, int], object]:
        return lambda length, seed: naive.generate(prompt_ids, batch, length)

    rows = {}
    for name, make in (("textgen", textgen_generate), ("naive", naive_generate)):
        for batch in (1, 64):
            rows[f"{name}_b{batch}"] = throughput(make(batch), batch, args.length, args.seconds)
    if args.frequency_penalty:  # textgen's penalized loop, which counts each row's characters
        for batch in (1, 64):
            generate = textgen_generate(batch, args.frequency_penalty)
            rows[f"textgen_penalized_b{batch}"] = throughput(generate, batch, args.length, args.seconds)
    rows["textgen_b1"].update(first_char_loaded_ms=textgen_first_ms, first_char_with_load_ms=textgen_load_ms)
    rows["naive_b1"].update(first_char_loaded_ms=naive_first_ms, first_char_with_load_ms=naive_load_ms)

    naive_b1 = rows["naive_b1"]["chars_per_s"]
    ratios = {
        "textgen_b1_vs_naive_b1": rows["textgen_b1"]["chars_per_s"] / naive_b1,
        "textgen_b64_vs_naive_b1": rows["textgen_b64"]["chars_per_s"] / naive_b1,
        "first_char_loaded_ms": textgen_first_ms,
    }
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": os.getloadavg()[0],
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__},
        "run": run.name,
        "model": {k: getattr(cfg, k) for k in ("layers", "units", "embedding_dim", "vocab_size")},
        "settings": {
            "temperature": args.temperature,
            "length": args.length,
            "seconds": args.seconds,
            "prompt": args.prompt,
            "threads": f"{profile.name} profile sampling threads: {profile.sample_intra_op_threads} intra-op x {profile.sample_inter_op_threads} inter-op (as textgen sample and repl)",
        },
        "tensorflow_import_s": import_s,
        "keras_first_load_ms": keras_first_load_ms,
        "results": rows,
        "ratios": ratios,
        "targets": TARGETS,
        "met": {
            "textgen_b1_vs_naive_b1": ratios["textgen_b1_vs_naive_b1"] >= TARGETS["textgen_b1_vs_naive_b1"],
            "textgen_b64_vs_naive_b1": ratios["textgen_b64_vs_naive_b1"] >= TARGETS["textgen_b64_vs_naive_b1"],
            "first_char_loaded_ms": textgen_first_ms <= TARGETS["first_char_loaded_ms"],
        },
    }


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m, s = report["model"], report["settings"]
    table = Table(
        title=f"Sampling from {report['run']} ({m['layers']}x{m['units']} LSTM, {m['vocab_size']} ids), "
        f"temperature {s['temperature']}, {s['length']} chars per call, {s['seconds']:g} s each"
    )
    columns = ("", "chars/s", "ms/char", "ms/step", "1st char", "1st char + load")
    for column in columns:
        table.add_column(column, justify="right" if column else "left")

    def ms(row: dict, key: str) -> str:
        return f"{row[key]:,.1f} ms" if key in row else "-"

    for name, row in report["results"].items():
        kind = (
            "textgen, penalized" if "penalized" in name else "textgen" if name.startswith("textgen") else "naive loop"
        )
        label = f"{kind}, batch {row['batch']}"
        table.add_row(
            label,
            f"{row['chars_per_s']:,.0f}",
            f"{row['ms_per_char']:.4f}",
            f"{row['ms_per_step']:.3f}",
            ms(row, "first_char_loaded_ms"),
            ms(row, "first_char_with_load_ms"),
        )
    console = Console(highlight=False)
    console.print(table)
    r, t, met = report["ratios"], report["targets"], report["met"]

    def verdict(key: str) -> str:
        return "[green]met[/]" if met[key] else "[red]missed[/]"

    console.print(
        f"textgen batch 1 / naive batch 1:        {r['textgen_b1_vs_naive_b1']:8.1f}x  "
        f"(target >= {t['textgen_b1_vs_naive_b1']:g}x) {verdict('textgen_b1_vs_naive_b1')}"
    )
    console.print(
        f"textgen batch 64 total / naive batch 1: {r['textgen_b64_vs_naive_b1']:8.1f}x  "
        f"(target >= {t['textgen_b64_vs_naive_b1']:g}x) {verdict('textgen_b64_vs_naive_b1')}"
    )
    console.print(
        f"first character, model loaded:          {r['first_char_loaded_ms']:8.1f} ms "
        f"(target <= {t['first_char_loaded_ms']:g} ms) {verdict('first_char_loaded_ms')}"
    )
    console.print(
        f"{report['date']}, {report['cores']} cores, load avg (1 min) {report['load_avg_1m_before']:.2f} -> "
        f"{report['load_avg_1m_after']:.2f}; TensorFlow {report['versions']['tensorflow']} "
        f"(import {report['tensorflow_import_s']:.1f} s, not counted); {s['threads']}"
    )
    console.print(
        "1st char: from asking for text to the first streamed piece, model loaded and warm; "
        "+ load: loading the run's weights and building the sampler included (Keras' one-time start-up "
        f"of {report['keras_first_load_ms']:,.0f} ms paid before, untimed). "
        "ms/step: one character of every sequence in the batch."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="run name [default: the latest run]")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"), help="where runs are saved")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured wall time per throughput figure")
    parser.add_argument("--length", type=int, default=2000, help="characters per sequence per call")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (> 0)")
    parser.add_argument("--prompt", default="The ", help="text both samplers read first")
    parser.add_argument(
        "--frequency-penalty", type=float, default=0.0, help="also time textgen's penalized loop with this penalty"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    if args.temperature <= 0 or args.length <= 0 or args.seconds <= 0:
        parser.error("--temperature, --length and --seconds must be positive")
    report = measure(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
