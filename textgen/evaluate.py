"""Cross-entropy of a trained run on held-out text, scored in long stateful streams."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from textgen.checkpoint import Run
from textgen.config import ModelConfig
from textgen.corpus import read_corpus, resolve_corpus
from textgen.data import load_splits
from textgen.errors import ConfigError, CorpusError
from textgen.model import build_model
from textgen.vocab import UNKNOWN_ID

SPLITS = ("test", "val")


@dataclass(frozen=True)
class Evaluation:
    """Mean cross-entropy over ``chars`` scored characters."""

    source: str
    nats_per_char: float
    chars: int
    unknown: int  # characters outside the vocabulary (scored as the unknown id)
    streams: int
    method: str = "stateful streams"  # contiguous streams, LSTM state carried across chunks

    @property
    def bits_per_char(self) -> float:
        return self.nats_per_char / math.log(2.0)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nats_per_char)


def evaluate_run(
    run: Run, split: str = "test", file: str | None = None, which: str = "best", streams: int = 16, chunk: int = 250
) -> Evaluation:
    """Score ``run`` on its ``split`` (the same contiguous split training used) or on a text ``file``."""
    cfg, vocab = run.load_config(), run.load_vocab()
    if file is not None:
        text = read_corpus(resolve_corpus(file), strip_boilerplate=cfg.data.strip_boilerplate)
        ids, source = vocab.encode(text), file
    else:
        if split not in SPLITS:
            raise ConfigError(f"--split must be one of {', '.join(SPLITS)} (got {split!r})")
        if not Path(cfg.data.corpus).is_file():
            raise CorpusError(
                f"the run's corpus {cfg.data.corpus} is gone; give the text to score as an argument: textgen evaluate FILE"
            )
        ids = getattr(load_splits(cfg.data, vocab), split)
        source = f"{split} split of {Path(cfg.data.corpus).name}"
    if len(ids) < 2:
        raise CorpusError(f"{source} has {len(ids)} characters; at least 2 are needed to score one")
    streams = max(1, min(streams, (len(ids) - 1) // 2))
    nats, chars = score_ids(run, cfg.model, ids, streams, chunk, which)
    return Evaluation(source, nats / chars, chars, int(np.sum(ids == UNKNOWN_ID)), streams)


def score_ids(
    run: Run, model_cfg: ModelConfig, ids: np.ndarray, streams: int, chunk: int, which: str
) -> tuple[float, int]:
    """Summed cross-entropy (nats) and characters scored: ``streams`` contiguous streams, state carried."""
    length = (len(ids) - 1) // streams
    model = build_model(model_cfg, batch_size=streams, stateful=True)
    run.load_weights(model, which)
    inputs = ids[: streams * length].reshape(streams, length)
    targets = np.stack([ids[s * length + 1 : (s + 1) * length + 1] for s in range(streams)])

    @tf.function(reduce_retracing=True)
    def chunk_loss(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        logits = model(x, training=False)
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, tf.cast(logits, tf.float32)))

    total = 0.0
    for start in range(0, length, chunk):
        x = tf.constant(inputs[:, start : start + chunk], tf.int32)
        y = tf.constant(targets[:, start : start + chunk], tf.int32)
        total += float(chunk_loss(x, y))
    return total, streams * length
