"""Choosing a runtime for an exported model (``textgen.artifact``): the LiteRT interpreter for a ``.tflite`` export,
without importing TensorFlow, or TensorFlow for a SavedModel; a sampler from it, and text scored with it."""

from __future__ import annotations

from pathlib import Path

from textgen.artifact import LITERT_FILE, ArtifactInfo, ExportFormat, is_artifact
from textgen.corpus import read_corpus, resolve_corpus, resolve_encoding
from textgen.generation import Sampler
from textgen.layout import scoring_layout
from textgen.litert import LiteRTGenerator
from textgen.results import Evaluation
from textgen.vocab import UNKNOWN_ID


def open_artifact(path: Path) -> tuple[Sampler, ArtifactInfo]:
    """A sampler for an exported model (its directory, or a file in it such as ``model.tflite``): LiteRT without
    TensorFlow, a SavedModel with it."""
    path = Path(path)
    if path.is_file() and is_artifact(path.parent):
        path = path.parent
    info = ArtifactInfo.read(path)
    if info.format == ExportFormat.litert.value:
        return LiteRTGenerator(info.model, info.vocab, path / LITERT_FILE), info
    from textgen.device import configure_for_inference, import_tensorflow

    import_tensorflow()
    configure_for_inference()
    from textgen.sampling import SavedModelGenerator

    return SavedModelGenerator(info.model, info.vocab, path), info


def evaluate_artifact(path: Path, file: str, encoding: str = "auto", streams: int | None = None) -> Evaluation:
    """Score an exported model on a text ``file``, laid out as its run's validation was (a LiteRT model without
    TensorFlow)."""
    sampler, info = open_artifact(path)
    corpus = resolve_corpus(file)
    ids = info.vocab.encode(read_corpus(corpus, info.strip_boilerplate, resolve_encoding(corpus, encoding)))
    layout = scoring_layout(len(ids), streams or info.batch_size, info.seq_len, file)
    nats, chars = sampler.score(ids, layout)
    unknown = layout.count_in_targets(ids, UNKNOWN_ID)
    return Evaluation(str(path), file, nats / chars, chars, unknown, layout.streams, layout.seq_len)
