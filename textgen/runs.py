"""Listing and summarising the runs of a checkpoint directory, as ``textgen runs`` shows them."""

from __future__ import annotations

import math
from pathlib import Path

from textgen.checkpoint import ResumeState, Run
from textgen.config import DEFAULT_CHECKPOINT_DIR, RunConfig, Weights
from textgen.errors import CheckpointError
from textgen.results import RunSummary, bits, lstm_shape
from textgen.rundirs import list_runs


def run_summaries(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[RunSummary]:
    """Every run under ``checkpoint_dir``, most recently updated first, as ``textgen runs`` lists them;
    a damaged run is listed with what is wrong, and never hides the others."""
    summaries = []
    for run in list_runs(checkpoint_dir):
        try:
            summaries.append(run_summary(run))
        except CheckpointError as exc:
            summaries.append(RunSummary(run.name, problem=str(exc)))
    return summaries


def run_summary(run: Run) -> RunSummary:
    """One run as `textgen runs` lists it; a `CheckpointError` if its files cannot be read."""
    run.load_vocab()  # and the config it is checked against: a damaged vocabulary is said, not shown as incomplete
    cfg = run.load_config()
    state = run.load_state() if run.has_state() else ResumeState(epoch=0, batch=0)
    best = state.best_val_loss
    return RunSummary(
        run=run.name,
        corpus=cfg.data.corpus_name,
        model=lstm_shape(cfg.model.layers, cfg.model.units)
        + (f", dropout {cfg.model.dropout:g}" if cfg.model.dropout else "")
        + (", layer-normalized" if cfg.model.layer_norm else ""),
        epochs=state.epoch,
        batches_into_epoch=state.batch,
        steps=state.step,
        best_val_bpc=bits(best) if math.isfinite(best) else None,
        seconds=state.seconds,
        finished=state.finished,
        usable=run.is_usable(),
        device=cfg.profile.name,
        config=cfg.to_dict(),
        made_from=made_from(cfg),
    )


def made_from(cfg: RunConfig) -> str:
    """What a run made by ``textgen distill``, ``textgen prune`` or ``textgen train --init-from`` was made from; empty
    for others."""
    if cfg.distill:
        return f"distilled from {Path(cfg.distill.teacher).name}"
    if cfg.prune:
        return f"pruned to {cfg.prune.sparsity:.0%} from {Path(cfg.prune.source).name}"
    if cfg.init_from:
        init = cfg.init_from
        added = cfg.model.vocab_size - init.model.vocab_size
        frozen = f", {init.freeze} frozen" if init.freeze != "none" else ""
        weights = (
            f" ({init.export} export)" if init.export else " (last weights)" if init.weights == Weights.last else ""
        )
        return f"fine-tuned from {init.name}{weights}, {added} new character{'s' * (added != 1)}{frozen}"
    return ""
