"""Exported models on disk: a directory holding the network and ``textgen.json`` (vocabulary, model config,
how it was exported), so that nothing else from the run is needed to use it.

Reading one imports no TensorFlow: a LiteRT artifact runs on the ``ai-edge-litert`` interpreter alone.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textgen.config import ModelConfig, from_dict, to_dict
from textgen.corpus import read_corpus, resolve_corpus, resolve_encoding
from textgen.errors import ConfigError
from textgen.generation import Sampler
from textgen.layout import scoring_layout
from textgen.results import Evaluation
from textgen.vocab import UNKNOWN_ID, Vocabulary

INFO_FILE = "textgen.json"
LITERT_FILE = "model.tflite"
ARTIFACT_VERSION = 1
STEP_SIGNATURE = "step"  # the next-token step, in both formats


def state_names(layers: int) -> list[str]:
    """The step's state inputs and outputs, in order: ``h_0``, ``c_0``, ``h_1``, ``c_1``, ..."""
    return [f"{kind}_{layer}" for layer in range(layers) for kind in ("h", "c")]


class ExportFormat(str, enum.Enum):
    """Where an exported model runs."""

    litert = "litert"  # a .tflite next-token step for the LiteRT interpreter (phones, browsers, servers)
    savedmodel = "savedmodel"  # TensorFlow's format, with a generate signature for TF Serving


class Quantize(str, enum.Enum):
    """How a LiteRT export stores its weights."""

    none = "none"  # float32
    float16 = "float16"  # half the size; computed in float32
    int8 = "int8"  # dynamic-range: int8 weights, float activations


@dataclass(frozen=True)
class ArtifactInfo:
    """What ``textgen.json`` records about an exported model."""

    format: str
    quantize: str
    model: ModelConfig
    vocab: Vocabulary
    run: str  # the run it was exported from, and which of its weights
    weights: str
    batch_size: int  # the run's layout, so that scoring a text reads it as training's validation did
    seq_len: int
    strip_boilerplate: bool

    def to_json(self) -> str:
        info: dict[str, Any] = {
            "textgen_artifact": ARTIFACT_VERSION,
            "format": self.format,
            "quantize": self.quantize,
            "model": to_dict(self.model),
            "chars": "".join(self.vocab.chars),  # id i + 1 is chars[i]; id 0 is the unknown character
            "run": self.run,
            "weights": self.weights,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "strip_boilerplate": self.strip_boilerplate,
        }
        return json.dumps(info, ensure_ascii=False, indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> ArtifactInfo:
        """The info of the artifact directory ``path``; one clear error if it is not one."""
        info_path = Path(path) / INFO_FILE
        if not Path(path).exists():
            raise ConfigError(f"--model {path}: no such file or directory; give a directory made by textgen export")
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            if not isinstance(info, dict):
                raise ValueError("not a JSON object")
            if info.pop("textgen_artifact") != ARTIFACT_VERSION:
                raise ValueError("written by another textgen version")
            chars = info.pop("chars")
            return cls(**{**info, "model": from_dict(ModelConfig, info["model"]), "vocab": Vocabulary(tuple(chars))})
        except (FileNotFoundError, NotADirectoryError):
            raise ConfigError(
                f"--model {path} is not a textgen export (it has no {INFO_FILE}); make one with textgen export"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read {info_path} ({exc.strerror or exc})") from None
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise ConfigError(f"{info_path} is damaged ({exc}); export the run again") from None


def is_artifact(path: Path) -> bool:
    """Whether ``path`` is a directory that ``textgen export`` wrote."""
    return (Path(path) / INFO_FILE).is_file()


def open_artifact(path: Path) -> tuple[Sampler, ArtifactInfo]:
    """A sampler for an exported model (its directory, or a file in it such as ``model.tflite``): LiteRT without
    TensorFlow, a SavedModel with it."""
    path = Path(path)
    if path.is_file() and is_artifact(path.parent):
        path = path.parent
    info = ArtifactInfo.read(path)
    if info.format == ExportFormat.litert.value:
        from textgen.litert import LiteRTGenerator

        return LiteRTGenerator(info.model, info.vocab, Path(path) / LITERT_FILE), info
    from textgen.device import configure_for_inference, import_tensorflow

    import_tensorflow()
    configure_for_inference()
    from textgen.sampling import SavedModelGenerator

    return SavedModelGenerator(info.model, info.vocab, Path(path)), info


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
