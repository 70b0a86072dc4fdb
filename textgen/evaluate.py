"""Cross-entropy of a trained run on held-out text: its own validation or test split, or any text file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from textgen.checkpoint import Run, check_corpus_unchanged
from textgen.config import SPLITS, Split, Weights
from textgen.corpus import read_corpus, resolve_corpus, resolve_encoding
from textgen.data import load_splits, write_id_file
from textgen.errors import ConfigError, CorpusError
from textgen.idcache import cache_root
from textgen.layout import scoring_layout
from textgen.model import build_model
from textgen.results import Evaluation
from textgen.scoring import compile_eval_step, score
from textgen.tracking import Track, untracked
from textgen.vocab import UNKNOWN_ID


def _writable(root: Path) -> bool:
    """Whether ``root`` (or its closest existing parent) can be written to."""
    existing = root if root.exists() else next((p for p in root.parents if p.exists()), root)
    return os.access(existing, os.W_OK)


def evaluate_run(
    run: Run,
    split: Split = Split.test,
    file: str | None = None,
    weights: Weights = Weights.best,
    encoding: str = "auto",
    streams: int | None = None,
    cache_dir: Path | None = None,
    track: Track = untracked,
) -> Evaluation:
    """Score ``run`` on its ``split`` (the contiguous split training used) or on a text ``file``.

    The text is read as training's validation reads it (``textgen.scoring``): the run's batch of
    contiguous streams (or ``streams`` of them), state carried across batches; a text too short for that is
    read as fewer or shorter streams. A split is read from the id cache in ``cache_dir`` (by default the one
    beside the run).
    """
    if split not in SPLITS:  # held-out text only (split_ids also reads the training split, for textgen.dynamic)
        raise ConfigError(f"--split must be one of {', '.join(SPLITS)} (got {split!r})")
    cfg = run.load_config()
    with tempfile.TemporaryDirectory(prefix="textgen-evaluate-") as scratch:
        ids, source = text_ids(run, split, file, encoding, cache_dir, Path(scratch))
        layout = scoring_layout(len(ids), streams or cfg.data.batch_size, cfg.data.seq_len, source)
        model = build_model(cfg.model, layout.streams, cfg.profile.precision)
        run.load_weights(model, weights)
        nats, chars = score(compile_eval_step(model, cfg.profile), model, ids, layout, track=track)
        unknown = layout.count_in_targets(ids, UNKNOWN_ID)
    return Evaluation(run.name, source, nats / chars, chars, unknown, layout.streams, layout.seq_len)


def text_ids(
    run: Run, split: Split, file: str | None, encoding: str, cache_dir: Path | None, scratch: Path
) -> tuple[np.ndarray, str]:
    """The ids of a text ``file`` (written to an id file in ``scratch``, as ``score`` reads them) or of the run's
    ``split``, and what they are, for messages."""
    cfg, vocab = run.load_config(), run.load_vocab()
    if file is not None:
        path = resolve_corpus(file)
        text = read_corpus(path, cfg.data.strip_boilerplate, resolve_encoding(path, encoding))
        return write_id_file(vocab.encode_compact(text), scratch / "ids"), file
    return split_ids(run, split, scratch, cache_dir), f"the {split} split of {cfg.data.corpus_name}"


def split_ids(run: Run, split: str, scratch: Path, cache_dir: Path | None = None) -> np.ndarray:
    """The ids of ``run``'s ``split``, from the id cache (encoded into ``scratch`` if the cache is read-only:
    someone else's runs on a read-only mount)."""
    cfg = run.load_config()
    if split not in (*SPLITS, "train"):  # the training split: dynamic evaluation's gradient statistics
        raise ConfigError(f"--split must be one of {', '.join(SPLITS)} (got {split!r})")
    missing = [p for p in cfg.data.paths if not Path(p).is_file()]
    if missing:
        raise CorpusError(
            f"the run's corpus {missing[0]} is gone; give the text to score as an argument: textgen evaluate FILE"
        )
    check_corpus_unchanged(run, cfg.data)
    root = cache_dir or cache_root(run.path.parent)
    ids: np.ndarray = getattr(load_splits(cfg.data, root if _writable(root) else scratch, run.load_vocab()), split)
    return ids
