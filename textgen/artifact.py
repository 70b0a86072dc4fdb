"""Exported models on disk: a directory holding the network and ``textgen.json`` (vocabulary, model config,
how it was exported), so that nothing else from the run is needed to use it.

Reading one imports no TensorFlow: a LiteRT artifact runs on the ``ai-edge-litert`` interpreter alone
(``textgen.runtime`` chooses the runtime for an export).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textgen.config import ModelConfig, from_dict, to_dict
from textgen.errors import ConfigError
from textgen.vocab import Vocabulary

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
