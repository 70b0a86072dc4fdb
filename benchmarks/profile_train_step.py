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
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def timed(fn, seconds: float) -> float:
    """Milliseconds per call of ``fn`` over ``seconds``, after two warm-up calls."""
    fn()
    fn()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - started) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--trace", help="write a TensorBoard profiler trace of 5 fast steps here")
    args = parser.parse_args()

    from textgen.device import CPU, apply_profile

    apply_profile(CPU)
    import keras
    import tensorflow as tf

    from textgen.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from textgen.fastlstm import stateful_logits
    from textgen.train import build_trainer

    batch, seq, units, vocab = 64, 100, 512, 105
    cfg = RunConfig(
        DataConfig(corpus="", batch_size=batch, seq_len=seq),
        ModelConfig(vocab_size=vocab, units=units, layers=1, dropout=0.0),
        TrainConfig(),
        CPU,
    )
    trainer = build_trainer(cfg)
    model = trainer.model
    x = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32)
    y = tf.random.uniform((batch, seq), 0, vocab, dtype=tf.int32)

    def loss(fast: bool) -> tf.Tensor:
        logits = stateful_logits(model, x, True) if fast else model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    def gradients(fast: bool):
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
    recurrent = tf.random.normal([units, 4 * units])
    dz = tf.random.normal([batch, 4 * units])

    @tf.function
    def recurrent_matmuls() -> tf.Tensor:
        state, grad = h, dz
        for _ in range(seq):  # chained, as in the loop: no step can be skipped or merged
            state = tf.matmul(state, recurrent)[:, :units] * 0.01
            grad = tf.concat([tf.matmul(grad, recurrent, transpose_b=True)] * 4, axis=1) * 0.01
        return state[0, 0] + grad[0, 0]

    rows = [
        ("fast LSTM: forward + loss", timed(lambda: forward[True]().numpy(), args.seconds)),
        ("fast LSTM: forward + gradients", timed(lambda: backward[True]().numpy(), args.seconds)),
        ("fast LSTM: full train step", timed(lambda: trainer.train_step(x, y).numpy(), args.seconds)),
        ("Keras LSTM: forward + loss", timed(lambda: forward[False]().numpy(), args.seconds)),
        ("Keras LSTM: forward + gradients", timed(lambda: backward[False]().numpy(), args.seconds)),
        (
            "200 recurrent matmuls alone (64x512 @ 512x2048 and back)",
            timed(lambda: recurrent_matmuls().numpy(), args.seconds),
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
