"""Choosing a runtime for an exported model (``textgen.artifact``): the LiteRT interpreter for a ``.tflite`` export,
without importing TensorFlow, or TensorFlow for a SavedModel; a sampler from it, and text scored with it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from textgen.artifact import (
    INFO_FILE,
    MANIFEST_FILE,
    NETWORK_FILES,
    START_FILE,
    STEP_SIGNATURE,
    ArtifactInfo,
    ExportFormat,
    artifact_dir,
    check_step,
)
from textgen.corpus import read_corpus, resolve_corpus, resolve_encoding
from textgen.errors import ConfigError, TextgenWarning, one_line
from textgen.generation import Sampler, Start
from textgen.layout import scoring_layout
from textgen.litert import LiteRTGenerator
from textgen.results import Evaluation
from textgen.startstate import load_start
from textgen.tracking import Track, untracked
from textgen.vocab import UNKNOWN_ID


def open_artifact(path: Path, inference: bool = True) -> tuple[Sampler, ArtifactInfo]:
    """A sampler for an exported model (its directory, or a file in it such as ``model.tflite``): LiteRT without
    TensorFlow, a SavedModel with it (under the sampling thread pools, unless not for ``inference``: training
    reads an export with its own). Its files are checked first (``ArtifactInfo.read``), and its network against
    textgen.json."""
    path = artifact_dir(path) or Path(path)
    info = ArtifactInfo.read(path)
    network = path / NETWORK_FILES[info.format]
    if not network.is_file():  # an export from before the manifest has only this check
        raise ConfigError(f"{path} has no {network.name}, which its {INFO_FILE} describes; export the run again")
    sampler = _open_network(network, info, inference)
    sampler.start = _start(path, info)
    if not (path / MANIFEST_FILE).exists():  # an export from before the manifest (ArtifactInfo.read checks the rest)
        warnings.warn(
            f"{path} has no {MANIFEST_FILE} (it was exported before textgen checked its exports), so its files "
            "cannot be checked; export the run again to add one",
            TextgenWarning,
            stacklevel=2,
        )
    return sampler, info


def _start(path: Path, info: ArtifactInfo) -> Start | None:
    """The start state an export carries (``textgen.startstate``); None, for zeros, in an export from before it
    did (``ArtifactInfo.read`` has required it of one since)."""
    start = path / START_FILE
    if not start.exists():
        return None
    try:
        return load_start(start, info.model.layers, info.model.units, info.model.vocab_size)[0]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{start} is damaged ({one_line(exc)}); export the run again") from None


def _open_network(network: Path, info: ArtifactInfo, inference: bool) -> Sampler:
    """The sampler of the network file of an export, once it agrees with textgen.json."""
    if info.format == ExportFormat.litert.value:
        return LiteRTGenerator(info.model, info.vocab, network)
    from textgen.device import configure_for_inference, import_tensorflow

    import_tensorflow()
    if inference:
        configure_for_inference()
    from textgen.sampling import SavedModelGenerator

    try:
        generator = SavedModelGenerator(info.model, info.vocab, network.parent)
        step = generator.loaded.signatures[STEP_SIGNATURE]
    except Exception as exc:  # TensorFlow raises many kinds for a damaged SavedModel (OpError, OSError, IndexError)
        raise ConfigError(f"TensorFlow cannot load {network.parent} ({one_line(exc)}); export the run again") from None
    inputs, outputs = step.structured_input_signature[1], step.structured_outputs
    check_step(network, info.model, _widths(inputs), _widths(outputs))
    return generator


def _widths(specs: dict[str, Any]) -> dict[str, int]:
    """The last dimension of each of a signature's ``TensorSpec``s, by name (-1 for the batch of ids)."""
    return {name: spec.shape[-1] if spec.shape[-1] is not None else -1 for name, spec in specs.items()}


def evaluate_artifact(
    path: Path, file: str, encoding: str = "auto", streams: int | None = None, track: Track = untracked
) -> Evaluation:
    """Score an exported model on a text ``file``, laid out as its run's validation was (a LiteRT model without
    TensorFlow)."""
    sampler, info = open_artifact(path)
    corpus = resolve_corpus(file)
    ids = info.vocab.encode(read_corpus(corpus, info.strip_boilerplate, resolve_encoding(corpus, encoding)))
    layout = scoring_layout(len(ids), streams or info.batch_size, info.seq_len, file)
    nats, chars = sampler.score(ids, layout, track)
    unknown = layout.count_in_targets(ids, UNKNOWN_ID)
    return Evaluation(str(path), file, nats / chars, chars, unknown, layout.streams, layout.seq_len)
