"""Does layer normalization inside the LSTM earn its cost on the fast CPU path? (issue 18)

A layer-normalized LSTM (Ba, Kiros & Hinton, 2016, eq. 20-22) on textgen's fast path: the input and the
recurrent projections each normalized over their 4U pre-activations with a learned gain, the cell normalized
before its tanh with a gain and a shift,

    z = LN(x @ kernel) * gain_x + LN(h @ recurrent_kernel) * gain_h + bias
    c = f * c + i * g;    h = o * tanh(LN(c) * gain_c + shift_c)

with a hand-written backward pass like ``textgen.fastlstm``'s (one matmul per step each way; the weight
gradients one matmul outside the loop). Each recipe trains with the real ``textgen train`` (its data, schedule,
validation and checkpoints), once as it is and once with every LSTM layer-normalized, in turn, each in its own
process with the whole machine; then ``textgen evaluate`` scores both on the test split. The table sets their
chars/s (the cost) beside their validation loss at each epoch, with the minutes it took (what the cost
bought), and their test loss after the same budget. Each arm runs once: this host drifts 10-15%, so a chars/s
ratio within that needs ``--normalized-first`` for the other order, or ``train_throughput.py --alternate``.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/layer_norm.py --check       # the gradient against TensorFlow's
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/layer_norm.py --time-budget 20m
    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/layer_norm.py --time-budget 60m -- --layers 2

Everything after ``--`` goes to ``textgen train`` for both. The experiment patches textgen in the child process
(the model gets the gains and shifts as extra weights of each LSTM layer; scoring runs the normalized
recurrence); textgen itself has no layer-normalized LSTM unless this shows it pays.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from typing import Any

from common import REF_CORPUS

EPSILON = 1e-3  # keras.layers.LayerNormalization's
UNROLL = 4


def _normalize(v: Any) -> tuple[Any, Any]:
    """``v`` normalized over its last axis, and the reciprocal of its standard deviation (..., 1)."""
    import tensorflow as tf

    centred = v - tf.reduce_mean(v, axis=-1, keepdims=True)
    inv_std = tf.math.rsqrt(tf.reduce_mean(centred * centred, axis=-1, keepdims=True) + EPSILON)
    return centred * inv_std, inv_std


def _normalize_backward(d_normalized: Any, normalized: Any, inv_std: Any) -> Any:
    """The gradient of ``_normalize``'s input from that of its output."""
    import tensorflow as tf

    mean_d = tf.reduce_mean(d_normalized, axis=-1, keepdims=True)
    mean_d_x = tf.reduce_mean(d_normalized * normalized, axis=-1, keepdims=True)
    return inv_std * (d_normalized - mean_d - normalized * mean_d_x)


def _recurrence() -> Any:
    """The layer-normalized recurrence with its hand-written gradient (TensorFlow is imported only here)."""
    import tensorflow as tf

    from textgen.lstm import lstm_cell, run_unrolled

    @tf.function(jit_compile=True)
    def forward_loop(x_projection: Any, h0: Any, c0: Any, recurrent: Any, gain_h: Any, gain_c: Any, shift_c: Any):
        steps = tf.shape(x_projection)[0]

        def step(t: Any, h: Any, c: Any, *saved: Any) -> tuple[Any, ...]:
            c_prev = c
            r_hat, r_inv_std = _normalize(tf.matmul(h, recurrent))
            _, c, (i, f, g, o) = lstm_cell(x_projection[t] + gain_h * r_hat, c_prev)
            c_hat, c_inv_std = _normalize(c)
            tanh_n = tf.tanh(gain_c * c_hat + shift_c)
            h = o * tanh_n
            dn_dh = o * (1.0 - tanh_n * tanh_n)
            dz_factors = tf.concat(
                [g * i * (1.0 - i), c_prev * f * (1.0 - f), i * (1.0 - g * g), tanh_n * o * (1.0 - o)], axis=-1
            )
            values = (h, r_hat, r_inv_std, c_hat, c_inv_std, dn_dh, dz_factors, f)
            return t + 1, h, c, *(array.write(t, v) for array, v in zip(saved, values, strict=True))

        arrays = [tf.TensorArray(x_projection.dtype, size=steps) for _ in range(8)]
        carry = (tf.constant(0), h0, c0, *arrays)
        _, h_last, c_last, *saved = run_unrolled(step, carry, lambda t, *_: steps - t, UNROLL)
        return h_last, c_last, *(array.stack() for array in saved)

    @tf.function(jit_compile=True)
    def backward_loop(d_hs: Any, d_h_last: Any, d_c_last: Any, saved: Any, recurrent_t: Any, gain_h: Any, gain_c: Any):
        _, r_hat, r_inv_std, c_hat, c_inv_std, dn_dh, dz_factors, forget = saved
        steps = tf.shape(d_hs)[0]

        def step(t: Any, d_h_next: Any, d_c_next: Any, d_zs: Any, d_rs: Any, d_ns: Any) -> tuple[Any, ...]:
            d_h = d_hs[t] + d_h_next
            d_n = d_h * dn_dh[t]
            d_c = d_c_next + _normalize_backward(gain_c * d_n, c_hat[t], c_inv_std[t])
            d_z = tf.concat([d_c, d_c, d_c, d_h], axis=-1) * dz_factors[t]
            d_r = _normalize_backward(gain_h * d_z, r_hat[t], r_inv_std[t])
            return (
                t - 1,
                tf.matmul(d_r, recurrent_t),
                d_c * forget[t],
                d_zs.write(t, d_z),
                d_rs.write(t, d_r),
                d_ns.write(t, d_n),
            )

        arrays = [tf.TensorArray(d_hs.dtype, size=steps) for _ in range(3)]
        _, d_h0, d_c0, *written = run_unrolled(
            step, (steps - 1, d_h_last, d_c_last, *arrays), lambda t, *_: t + 1, UNROLL
        )
        return d_h0, d_c0, *(array.stack() for array in written)

    @tf.custom_gradient
    def ln_lstm_recurrence(
        x_projection: Any, h0: Any, c0: Any, recurrent: Any, gain_h: Any, gain_c: Any, shift_c: Any
    ) -> tuple[tuple[Any, Any, Any], Any]:
        """Like ``textgen.fastlstm.lstm_recurrence``: the hidden states (T, B, U) and the final (h, c)."""
        inputs = (x_projection, h0, c0, recurrent, gain_h, gain_c, shift_c)
        h_last, c_last, *saved = forward_loop(*(tf.stop_gradient(v) for v in inputs))
        hs = saved[0]

        def grad(d_hs: Any, d_h_last: Any, d_c_last: Any) -> tuple[Any, ...]:
            d_h0, d_c0, d_z, d_r, d_n = backward_loop(
                d_hs,
                tf.zeros_like(h0) if d_h_last is None else d_h_last,
                tf.zeros_like(c0) if d_c_last is None else d_c_last,
                saved,
                tf.transpose(recurrent),
                gain_h,
                gain_c,
            )
            units = tf.shape(h0)[-1]
            h_prev = tf.concat([h0[None], hs[:-1]], axis=0)
            d_recurrent = tf.matmul(tf.reshape(h_prev, [-1, units]), tf.reshape(d_r, [-1, 4 * units]), transpose_a=True)
            _, r_hat, _, c_hat, *_ = saved
            over_time_and_batch = [0, 1]
            return (
                d_z,
                d_h0,
                d_c0,
                d_recurrent,
                tf.reduce_sum(d_z * r_hat, over_time_and_batch),
                tf.reduce_sum(d_n * c_hat, over_time_and_batch),
                tf.reduce_sum(d_n, over_time_and_batch),
            )

        return (hs, h_last, c_last), grad

    return ln_lstm_recurrence


def _reference_recurrence(x_projection: Any, h0: Any, c0: Any, recurrent: Any, gain_h: Any, gain_c: Any, shift_c: Any):
    """The same recurrence written plainly, one Python step at a time, for TensorFlow to differentiate."""
    import tensorflow as tf

    from textgen.lstm import lstm_cell

    h, c, hs = h0, c0, []
    for t in range(x_projection.shape[0]):
        _, c, (_, _, _, o) = lstm_cell(x_projection[t] + gain_h * _normalize(tf.matmul(h, recurrent))[0], c)
        h = o * tf.tanh(gain_c * _normalize(c)[0] + shift_c)
        hs.append(h)
    return tf.stack(hs), h, c


def check_gradient() -> dict:
    """The hand-written gradient against TensorFlow's of the plain recurrence: the largest relative difference."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    steps, batch, units = 7, 3, 5
    shapes = [
        (steps, batch, 4 * units),
        (batch, units),
        (batch, units),
        (units, 4 * units),
        (4 * units,),
        (units,),
        (units,),
    ]
    inputs = [tf.constant(rng.normal(size=shape), tf.float32) for shape in shapes]
    inputs[4] = inputs[4] * 0.5 + 1.0  # gains near one, as they start
    inputs[5] = inputs[5] * 0.5 + 1.0
    weights = [
        tf.constant(rng.normal(size=shape), tf.float32)
        for shape in [(steps, batch, units), (batch, units), (batch, units)]
    ]
    fast = _recurrence()
    results = {}
    for name, function in (("fast", fast), ("reference", _reference_recurrence)):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = function(*inputs)
            loss = sum(tf.reduce_sum(w * out) for w, out in zip(weights, outputs, strict=True))
        results[name] = ([o.numpy() for o in outputs], [g.numpy() for g in tape.gradient(loss, inputs)])
    names = ["x_projection", "h0", "c0", "recurrent_kernel", "gain_h", "gain_c", "shift_c"]
    errors = {"outputs": max(_relative(a, b) for a, b in zip(results["fast"][0], results["reference"][0], strict=True))}
    errors |= {
        f"d_{n}": _relative(a, b) for n, a, b in zip(names, results["fast"][1], results["reference"][1], strict=True)
    }
    return errors


def _relative(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


GAINS = {"gain_x": ("4U", "ones"), "gain_h": ("4U", "ones"), "gain_c": ("U", "ones"), "shift_c": ("U", "zeros")}


def _patch_textgen() -> None:
    """Layer-normalize every LSTM that ``textgen train`` and ``textgen evaluate`` build and run, in this process."""
    import keras
    import tensorflow as tf

    from textgen import evaluate, fastlstm, model, scoring, train

    recurrence = _recurrence()
    build_plain_model = model.build_model

    def build_normalized_model(cfg: Any, batch_size: int, precision: str = "float32", stateful: bool = True) -> Any:
        built = build_plain_model(cfg, batch_size, precision, stateful)
        for layer in built.layers:
            if isinstance(layer, keras.layers.LSTM):
                size = {"4U": 4 * layer.cell.units, "U": layer.cell.units}
                layer._tracker.unlock()  # a built layer refuses new weights; these are its own, saved with it
                for name, (shape, init) in GAINS.items():
                    setattr(layer, name, layer.add_weight(shape=(size[shape],), initializer=init, name=name))
                layer._tracker.lock()
        return built

    def normalized_logits(built: Any, ids: Any, training: bool, seed: Any = None) -> Any:
        """``textgen.fastlstm.stateful_logits`` with the normalized recurrence."""
        x = tf.transpose(tf.gather(built.get_layer("embedding").embeddings, ids), [1, 0, 2])
        steps, batch = tf.shape(x)[0], tf.shape(x)[1]
        lstms = [layer for layer in built.layers if isinstance(layer, keras.layers.LSTM)]
        for n, layer in enumerate(lstms):
            cell = layer.cell
            if training and cell.dropout > 0:
                x = fastlstm._dropout(x, cell.dropout, [1, batch, tf.shape(x)[-1]], fastlstm._mask_seed(seed, n))
            projected = _normalize(tf.matmul(tf.reshape(x, [-1, tf.shape(x)[-1]]), cell.kernel))[0]
            x_projection = tf.reshape(projected * layer.gain_x + cell.bias, [steps, batch, 4 * cell.units])
            h_state, c_state = layer.states
            plain = (tf.convert_to_tensor(v) for v in (h_state, c_state, cell.recurrent_kernel))
            gains = (tf.convert_to_tensor(v) for v in (layer.gain_h, layer.gain_c, layer.shift_c))
            x, h_last, c_last = recurrence(x_projection, *plain, *gains)
            h_state.assign(tf.stop_gradient(h_last))
            c_state.assign(tf.stop_gradient(c_last))
        rate = built.get_layer("output_dropout").rate
        if training and rate > 0:
            x = fastlstm._dropout(x, rate, tf.shape(x), fastlstm._mask_seed(seed, len(lstms)))
        dense = built.get_layer("logits")
        logits = tf.matmul(tf.reshape(x, [-1, tf.shape(x)[-1]]), dense.kernel) + dense.bias
        return tf.transpose(tf.reshape(logits, [steps, batch, -1]), [1, 0, 2])

    make_plain_optimizer = train.make_optimizer

    def make_optimizer(tcfg: Any) -> Any:
        """textgen's optimizer, decaying no gain or shift (it would pull a gain towards zero), as no bias."""
        optimizer = make_plain_optimizer(tcfg)
        if tcfg.weight_decay or tcfg.optimizer == "adamw":
            optimizer.exclude_from_weight_decay(var_names=["bias", *GAINS])  # a second call replaces the first's
        return optimizer

    train.build_model = evaluate.build_model = build_normalized_model
    train.make_optimizer = make_optimizer
    scoring.stateful_logits = normalized_logits


def _child(args: list[str]) -> None:
    """``textgen ARGS`` with every LSTM layer-normalized."""
    _patch_textgen()
    from textgen.cli import app

    app(args)


def textgen(normalized: bool, *args: str) -> list[dict]:
    """A textgen command's JSON lines, as it is or layer-normalized (stops the benchmark if it fails)."""
    command = [sys.executable, __file__, "--child", "--"] if normalized else [sys.executable, "-m", "textgen"]
    done = subprocess.run([*command, *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"textgen {args[0]} failed: {done.stderr.strip()[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def measure(normalized: bool, recipe: list[str], time_budget: str, checkpoint_dir: str) -> dict:
    """Train ``recipe`` for ``time_budget``, score it on the test split: its epochs, chars/s and test loss."""
    run = "layer-norm" if normalized else "plain"
    lines = textgen(
        normalized, "train", REF_CORPUS, "--device", "cpu", "--time-budget", time_budget,
        "--checkpoint-dir", checkpoint_dir, "--run", run, *recipe,
    )  # fmt: skip
    epochs = [line for line in lines if line.get("event") == "epoch"]
    scored = textgen(normalized, "evaluate", "--run", run, "--checkpoint-dir", checkpoint_dir, "--split", "test")[0]
    # The run's chars/s: its batches over their time (each epoch's batches at that epoch's rate; chars per batch cancel).
    batches = sum(e["batches"] for e in epochs)
    return {
        "arm": run,
        "epochs": [{k: e[k] for k in ("epoch", "seconds", "val_loss", "loss", "chars_per_sec")} for e in epochs],
        "chars_per_sec": batches / sum(e["batches"] / e["chars_per_sec"] for e in epochs),
        "best_val_loss": min(e["val_loss"] for e in epochs),
        "test_nats_per_char": scored["nats_per_char"],
    }


def render(results: list[dict]) -> None:
    """Validation loss by epoch, then each arm's chars/s, best validation and test loss, with the ratios."""
    plain, normalized = results
    print("| epoch | plain: minutes | val nats/char | layer-norm: minutes | val nats/char |")
    print("|---:|---:|---:|---:|---:|")
    for n in range(max(len(plain["epochs"]), len(normalized["epochs"]))):
        cells = [
            f"{e[n]['seconds'] / 60:.1f} | {e[n]['val_loss']:.4f}" if n < len(e) else "— | —"
            for e in (plain["epochs"], normalized["epochs"])
        ]
        print(f"| {n + 1} | {cells[0]} | {cells[1]} |")
    for arm in results:
        print(
            f"{arm['arm']:>10}: {arm['chars_per_sec']:8,.0f} chars/s, best val {arm['best_val_loss']:.4f}, "
            f"test {arm['test_nats_per_char']:.4f} nats/char"
        )
    print(
        f"layer-norm / plain: chars/s {normalized['chars_per_sec'] / plain['chars_per_sec']:.3f}, "
        f"test {normalized['test_nats_per_char'] - plain['test_nats_per_char']:+.4f} nats/char"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare the hand-written gradient with TensorFlow's")
    parser.add_argument("--time-budget", default="20m", help="each arm's training budget (default 20m)")
    parser.add_argument("--normalized-first", action="store_true", help="train the layer-normalized arm first")
    parser.add_argument("--checkpoint-dir", help="keep both runs here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, recipe = parser.parse_known_args()
    recipe = [a for a in recipe if a != "--"]
    if args.child:
        _child(recipe)
        return
    if args.check:
        errors = check_gradient()
        print(json.dumps(errors, indent=2))
        worst = max(errors.values())
        if worst > 1e-4:
            raise SystemExit(f"the hand-written gradient differs from TensorFlow's by {worst:.2e} (relative)")
        return
    with tempfile.TemporaryDirectory() as scratch:
        runs = args.checkpoint_dir or scratch
        order = [True, False] if args.normalized_first else [False, True]
        by_arm = {normalized: measure(normalized, recipe, args.time_budget, runs) for normalized in order}
    results = [by_arm[False], by_arm[True]]
    if args.json:
        print(json.dumps({"time_budget": args.time_budget, "recipe": recipe, "arms": results}, indent=2))
    else:
        render(results)


if __name__ == "__main__":
    main()
