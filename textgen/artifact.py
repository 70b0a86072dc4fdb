"""Exported models on disk: a directory holding the network, ``textgen.json`` (vocabulary, model config, how it
was exported) and ``manifest.json`` (each file's size and SHA-256), so that nothing else from the run is needed to
use it, and a damaged or edited file is found before it is used.

Reading one imports no TensorFlow: a LiteRT artifact runs on the ``ai-edge-litert`` interpreter alone
(``textgen.runtime`` chooses the runtime for an export).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textgen.basemodel import base_path, damaged, is_base_dir, names_base
from textgen.checkpoint import VOCAB_BYTES
from textgen.config import ModelConfig
from textgen.errors import ConfigError, shown
from textgen.files import read_json_object
from textgen.typedjson import json_problem, to_dict
from textgen.vocab import Vocabulary

INFO_FILE = "textgen.json"
MANIFEST_FILE = "manifest.json"
LITERT_FILE = "model.tflite"
SAVED_MODEL_FILE = "saved_model.pb"
START_FILE = "start.npz"  # the state prompts are read from (textgen.startstate), from version 3
# 2: with a manifest. An export of version 1, made before the manifest existed, still loads (with a warning).
# 3: with the start state. An export of version 2 or 1 has none: its prompts are read from zeros.
ARTIFACT_VERSION = 3
STEP_SIGNATURE = "step"  # the next-token step, in both formats
EXPORT_AGAIN = "export the run again"  # what to do about an export that is damaged or from another textgen


def state_names(layers: int) -> list[str]:
    """The step's state inputs and outputs, in order: ``h_0``, ``c_0``, ``h_1``, ``c_1``, ..."""
    return [f"{kind}_{layer}" for layer in range(layers) for kind in ("h", "c")]


class ExportFormat(str, enum.Enum):
    """Where an exported model runs."""

    litert = "litert"  # a .tflite next-token step for the LiteRT interpreter (phones, browsers, servers)
    savedmodel = "savedmodel"  # TensorFlow's format, with a generate signature for TF Serving


NETWORK_FILES = {ExportFormat.litert.value: LITERT_FILE, ExportFormat.savedmodel.value: SAVED_MODEL_FILE}


class Quantize(str, enum.Enum):
    """How a LiteRT export stores its weights."""

    none = "none"  # float32
    float16 = "float16"  # half the size; computed in float32
    int8 = "int8"  # dynamic-range: int8 weights, float activations


# textgen.json's fields and their JSON types (ranges are checked by the values' classes).
INFO_FIELDS: dict[str, Any] = {
    "textgen_artifact": int,
    "format": ExportFormat,
    "quantize": Quantize,
    "model": ModelConfig,
    "chars": str,
    "run": str,
    "weights": str,
    "batch_size": int,
    "seq_len": int,
    "strip_boilerplate": bool,
}


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
        """The info of the artifact directory ``path``, once its files are checked against its manifest; one
        clear error if it is not an export, or not as it was exported (the package's base model: reinstall)."""
        try:
            return cls._read(Path(path))
        except ConfigError as exc:
            if is_base_dir(Path(path)):
                raise damaged(exc, EXPORT_AGAIN) from None
            raise

    @classmethod
    def _read(cls, path: Path) -> ArtifactInfo:
        info_path = path / INFO_FILE
        if not path.exists():
            raise ConfigError(f"--model {path}: no such file or directory; give a directory made by textgen export")
        try:
            version, info = _parse_info(read_json_object(info_path, VOCAB_BYTES))  # it holds the vocabulary
        except (FileNotFoundError, NotADirectoryError):
            raise ConfigError(
                f"--model {path} is not a textgen export (it has no {INFO_FILE}); make one with textgen export"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read {info_path} ({exc.strerror or exc})") from None
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{info_path} is damaged ({exc}); {EXPORT_AGAIN}") from None
        if version > ARTIFACT_VERSION:
            raise ConfigError(
                f"{path} was exported by a newer textgen (export format {version}, this one reads up to "
                f"{ARTIFACT_VERSION}); upgrade textgen"
            )
        # An export of version 1, from before the manifest, has none (textgen.runtime says so once it loads); a
        # version edited down is checked all the same.
        if version >= 2 or (path / MANIFEST_FILE).exists():
            check_files(path, [INFO_FILE, NETWORK_FILES[info.format], *([START_FILE] if version >= 3 else [])])
        return info


def _parse_info(data: dict[str, Any]) -> tuple[int, ArtifactInfo]:
    """textgen.json's format version and what it says; ``ValueError`` or ``ConfigError`` naming what is wrong."""
    missing, unknown = sorted(set(INFO_FIELDS) - set(data)), sorted(set(data) - set(INFO_FIELDS))
    if missing or unknown:
        raise ValueError(f"no {', '.join(missing)}" if missing else f"unknown keys {unknown}")
    problem = next((p for key, kind in INFO_FIELDS.items() if (p := json_problem(data[key], kind, key))), None)
    if problem:
        raise ValueError(problem)
    version, chars = data.pop("textgen_artifact"), data.pop("chars")
    if version < 1:
        raise ValueError(f"textgen_artifact={shown(version)}, not a format version")
    for key in ("batch_size", "seq_len"):
        if data[key] < 1:
            raise ValueError(f"{key}={shown(data[key])}, not a positive integer")
    if len(set(chars)) != len(chars):
        raise ValueError("chars holds a character twice")
    model = ModelConfig(**data.pop("model"))
    if model.vocab_size != len(chars) + 1:  # a shorter vocabulary than the logits would decode ids it has not
        raise ValueError(
            f"model.vocab_size={model.vocab_size}, but chars makes {len(chars) + 1} ids with the unknown one"
        )
    return version, ArtifactInfo(**data, model=model, vocab=Vocabulary(tuple(chars)))


def default_export_path(run: str, format: str, quantize: str = Quantize.none.value) -> Path:
    """Where ``textgen export`` writes run ``run`` by default: ``exports/<run>-<format>[-<quantize>]`` in the working
    directory."""
    suffix = "" if quantize == Quantize.none.value else f"-{quantize}"
    return Path("exports") / f"{run}-{format}{suffix}"


def is_artifact(path: Path) -> bool:
    """Whether ``path`` is a directory that ``textgen export`` wrote."""
    return (Path(path) / INFO_FILE).is_file()


def artifact_dir(path: Path | str) -> Path | None:
    """The export ``path`` names (its directory, or a file in it such as ``model.tflite``, or the base model's name:
    the package's export), or None."""
    if names_base(path):
        return base_path()
    path = Path(path)
    for directory in (path, path.parent) if path.is_file() else (path,):
        if is_artifact(directory):
            return directory
    return None


@dataclass(frozen=True)
class FileRecord:
    """A file of an export, as ``manifest.json`` records it."""

    bytes: int
    sha256: str


def file_digest(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(2**20):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path) -> None:
    """Record every file under ``directory`` (its path, size and SHA-256) in its manifest: the export's last file."""
    files = {
        file.relative_to(directory).as_posix(): dataclasses.asdict(FileRecord(file.stat().st_size, file_digest(file)))
        for file in sorted(directory.rglob("*"))
        if file.is_file()
    }
    manifest = {"files": files, "sha256": _records_digest(files)}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _records_digest(files: dict[str, Any]) -> str:
    """The manifest's own SHA-256, of its records: a damaged manifest is then not taken for a damaged file."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def check_files(directory: Path, required: list[str]) -> None:
    """One clear error unless the manifest of ``directory`` is whole, lists ``required``, and every file it lists
    is there with its size and SHA-256: sizes first (a truncated copy), then contents (a flipped byte, an edit)."""
    manifest = directory / MANIFEST_FILE
    records = _read_manifest(manifest)
    try:
        for name, record in records.items():
            _check_size(directory / name, record.bytes)
        for name, record in records.items():
            if file_digest(directory / name) != record.sha256:
                raise ConfigError(
                    f"{directory / name} has changed since it was exported (its SHA-256 is not the one in "
                    f"{MANIFEST_FILE}): damaged or edited; {EXPORT_AGAIN}"
                )
    except OSError as exc:
        raise ConfigError(f"cannot read {exc.filename} ({exc.strerror or exc})") from None
    unlisted = [name for name in required if name not in records]
    if unlisted:  # checked last: a textgen.json edited to another format is named as changed, above
        raise ConfigError(f"{manifest} is damaged (it does not list {', '.join(unlisted)}); {EXPORT_AGAIN}")


def _read_manifest(manifest: Path) -> dict[str, FileRecord]:
    try:
        data = read_json_object(manifest)
        problem = json_problem(data.get("files"), dict[str, FileRecord], "files") or json_problem(
            data.get("sha256"), str, "sha256"
        )
        if problem:
            raise ValueError(problem)
        if data["sha256"] != _records_digest(data["files"]):
            raise ValueError("its records do not match its own SHA-256")
        records = {name: FileRecord(**record) for name, record in data["files"].items()}
        outside = next((name for name in records if Path(name).is_absolute() or ".." in Path(name).parts), None)
        if outside is not None:
            raise ValueError(f"it lists {outside!r}, outside the export")
        return records
    except FileNotFoundError:
        raise ConfigError(f"{manifest} is missing: the export is incomplete; {EXPORT_AGAIN}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {manifest} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{manifest} is damaged ({exc}); {EXPORT_AGAIN}") from None


def _check_size(file: Path, size: int) -> None:
    try:
        actual = file.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"{file} is missing: the export is incomplete; {EXPORT_AGAIN}") from None
    if actual != size:
        raise ConfigError(
            f"{file} has changed since it was exported ({actual:,} bytes, not {size:,}): truncated, edited or "
            f"replaced; {EXPORT_AGAIN}"
        )


def check_step(network: Path, model: ModelConfig, inputs: dict[str, int], outputs: dict[str, int]) -> None:
    """One clear error unless the step in ``network`` (the last dimension of each of its inputs and outputs, by
    name) is the network that ``model``, textgen.json's, describes: its layers, units and vocabulary size."""
    if "ids" not in inputs or "h_0" not in inputs or "logits" not in outputs:
        raise ConfigError(
            f"{network} is not a model textgen exported (it has no {STEP_SIGNATURE} step); {EXPORT_AGAIN}"
        )
    found = {
        "layers": sum(name.startswith("h_") for name in inputs),
        "units": inputs["h_0"],
        "vocabulary size": outputs["logits"],
    }
    said = {"layers": model.layers, "units": model.units, "vocabulary size": model.vocab_size}
    for what, value in said.items():
        if found[what] != value:
            raise ConfigError(
                f"{network.parent / INFO_FILE} says {what} {value}, but {network.name} has {found[what]}: they are "
                f"not from the same export; {EXPORT_AGAIN}"
            )
    names = set(state_names(model.layers))
    if set(inputs) != {"ids", *names} or set(outputs) != {"logits", *names}:
        raise ConfigError(
            f"{network}'s step has inputs {sorted(inputs)} and outputs {sorted(outputs)}, not textgen's; {EXPORT_AGAIN}"
        )
