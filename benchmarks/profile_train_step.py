"""Where the time of one REF training step goes: forward, backward, optimizer, per-step loop.

    TEXTGEN_CORPUS_PATH=../shared/corpora python benchmarks/profile_train_step.py
    ... --trace /tmp/tb   # also write a TensorBoard profiler trace of 5 steps

Times, in one process on the ``cpu`` profile's threads, the forward pass alone, forward
plus gradients, and the full step (gradients, clipping, Adam) of textgen's fast LSTM
path and of Keras' LSTM on the same weights, and the two recurrent matmuls that the
loop cannot avoid (forward ``h @ R`` and backward ``dz @ R^T``, 100 each per batch).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from common import REF, REF_VOCAB_SIZE, ref_run_config, timed


def ms_per_call(call: Callable[[], object], seconds: float) -> float:
    """Milliseconds per call of ``call`` over ``seconds``, after two warm-up calls."""
    calls, elapsed = timed(call, seconds, warmup=2)
    return elapsed / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--trace", help="write a TensorBoard profiler trace of 5 fast steps here")
    args = parser.parse_args()

    from textgen.device import CPU, apply_profile, import_tensorflow

    import_tensorflow()
    apply_profile(CPU)
    import keras
    import tensorflow as tf

    from textgen.fastlstm import stateful_logits
    from textgen.training.step import build_trainer

    batch, seq, units, vocab = REF["batch_size"], REF["seq_len"], REF["units"], REF_VOCAB_SIZE
    trainer = build_trainer(ref_run_config("", vocab, CPU))
    model = trainer.model
    x = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32)
    y = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32)

    def loss(fast: bool) -> tf.Tensor:
        logits = stateful_logits(model, x, True) if fast else model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def gradients(fast: bool) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            value = loss(fast)
        return tape.gradient(value, model.trainable_variables)

    forward = {fast: tf.function(lambda fast=fast: loss(fast)) for fast in (True, False)}
    # Touch every gradient, or TensorFlow prunes the ones nobody reads.
    backward = {
        fast: tf.function(lambda fast=fast: tf.add_n([tf.reduce_sum(tf.convert_to_tensor(g)) for g in gradients(fast)]))
        for fast in (True, False)
    }
    h = tf.random.normal([batch, units])
    recurrent = tf.random.normal([units, 4 * units]) / 40.0
    recurrent_t = tf.transpose(recurrent)

    @tf.function
    def recurrent_matmuls() -> tf.Tensor:
        state = h
        for _ in range(seq):  # chained, as in the loop (forward h @ R, backward dz @ R^T): none can be skipped
            state = tf.tanh(tf.matmul(tf.matmul(state, recurrent), recurrent_t))  # tanh: no under- or overflow
        return state[0, 0]

    rows = [
        ("fast LSTM: forward + loss", ms_per_call(lambda: forward[True]().numpy(), args.seconds)),
        ("fast LSTM: forward + gradients", ms_per_call(lambda: backward[True]().numpy(), args.seconds)),
        ("fast LSTM: full train step", ms_per_call(lambda: trainer.train_step(x, y).numpy(), args.seconds)),
        ("Keras LSTM: forward + loss", ms_per_call(lambda: forward[False]().numpy(), args.seconds)),
        ("Keras LSTM: forward + gradients", ms_per_call(lambda: backward[False]().numpy(), args.seconds)),
        (
            "200 recurrent matmuls alone (64x512 @ 512x2048 and back)",
            ms_per_call(lambda: recurrent_matmuls().numpy(), args.seconds),
        ),
    ]
    step = rows[2][1]
    print(f"REF batch {batch} x {seq}, units {units}; ms per batch (share of the fast train step)")
    for name, ms in rows:
        print(f"  {name:<60} {ms:8.1f} ms  {ms / step:6.0%}")
    print(f"  fast train step: {batch * seq / step * 1000:,.0f} chars/s")
    if args.trace:
        tf.profiler.experimental.start(args.trace)
        for _ in range(5):
            trainer.train_step(x, y).numpy()
        tf.profiler.experimental.stop()
        print(f"trace written to {args.trace} (tensorboard --logdir {args.trace}, Profile tab)")


if __name__ == "__main__":
    main()
