"""``textgen export``: a run's network as a self-contained LiteRT or SavedModel directory (``textgen.artifact``).

Both are built from the sampler's own next-token function (``textgen.sampling.Generator``), so an
artifact computes what ``textgen sample`` computes. The SavedModel holds three serving signatures:

* ``step``: ``ids`` (B,) int32 and the states ``h_0``, ``c_0``, ... (B, units) -> ``logits`` (B, V) and the new states;
* ``generate``: ``prompt`` (B, P) int32 ids (P may be 0: the first character is then drawn from the start's
  logits), ``length``, ``temperature`` (0 = greedy), ``top_k`` (0 = off), ``top_p`` (1 = off), ``seed`` -> ``ids``
  (B, length): the whole loop in the graph;
* ``vocabulary``: -> ``chars`` (V,) strings, the character of each id (id 0, the unknown one, is U+FFFD);

and, for ``textgen sample --model`` and ``textgen serve``, the sampler's compiled ``feed``, ``generate_chunk``,
``generate_forced`` and ``generate_penalized`` (rows with penalties or a logit bias) functions. Both
formats carry ``start.npz``, the state every prompt is read from (``textgen.startstate``; arrays ``state_0``,
``state_1``, ... in the order of the step's ``h_0``, ``c_0``, ..., and ``logits`` there, which a prompt with nothing
to read draws from), which ``generate`` starts from too.
The LiteRT file holds the ``step`` signature (LiteRT converts a step with explicit states, not a Keras LSTM
loop), with ``--quantize float16`` (half-size weights) or ``int8`` (dynamic-range: int8 weights, float
activations).

An export is written in a scratch directory beside its path, ``manifest.json`` last (each file's size and SHA-256,
checked when it is opened), then renamed into place: a failed write or a stop signal removes the scratch
directory and leaves an earlier export as it was. A scratch directory that a kill leaves is removed by the next
export to the same path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.lite.python.convert_phase import ConverterError

from textgen.artifact import (
    INFO_FILE,
    LITERT_FILE,
    START_FILE,
    STEP_SIGNATURE,
    ArtifactInfo,
    ExportFormat,
    Quantize,
    default_export_path,
    is_artifact,
    state_names,
    write_manifest,
)
from textgen.basemodel import BASE_NAME, is_base_dir
from textgen.baserun import Base
from textgen.checkpoint import Run
from textgen.commands import fine_tune
from textgen.config import Weights
from textgen.errors import CheckpointError, ConfigError, ExportInterrupted, one_line
from textgen.files import fsync_path, fsync_tree
from textgen.generation import Start
from textgen.model import build_model
from textgen.results import ExportResult
from textgen.sampling import RECURRENT_BLOCKS, Generator
from textgen.signals import stop_signals
from textgen.startstate import save_start
from textgen.vocab import UNKNOWN_CHAR, Vocabulary


def export_run(
    run: Run, format: str, quantize: str, path: Path | None = None, which: Weights = Weights.best
) -> ExportResult:
    """Write ``run``'s ``which`` weights to ``path`` as a LiteRT or SavedModel artifact, atomically: an
    earlier export at ``path`` is replaced in one rename, anything else there is refused. A failed write (a full
    disk, TensorFlow's errors too) or a stop signal leaves the earlier export as it was, and no scratch files."""
    if format == ExportFormat.savedmodel.value and quantize != Quantize.none.value:
        raise ConfigError("--quantize applies to --format litert; a SavedModel keeps float32 weights")
    path = Path(path) if path is not None else default_export_path(run.name, format, quantize)
    kept = _kept(path)
    with stop_signals() as stop:

        def check_stop() -> None:
            if stop.requested:
                raise ExportInterrupted(f"export stopped by {stop.requested}; {kept}", stop.exit_code)

        cfg = run.load_config()
        generator = Generator.from_run(run, which, **_generator_options(format))
        info = ArtifactInfo(
            format=format,
            quantize=quantize,
            model=cfg.model,
            vocab=generator.vocab,
            run=run.name,
            weights=which,
            batch_size=cfg.data.batch_size,
            seq_len=cfg.data.seq_len,
            strip_boilerplate=cfg.data.strip_boilerplate,
        )
        check_stop()

        def write(directory: Path) -> None:
            _write(generator, info, directory, check_stop)
            check_stop()  # the last point to stop: a signal after it lets the export be put in place

        _put_in_place(path, kept, write)
    return _result(run.name, path, format, quantize)


def copy_export(source: Path, format: str, quantize: str, path: Path | None = None) -> ExportResult:
    """The package's base model (the export in ``source``, its files checked first) copied to ``path`` as it is,
    by default ``exports/base-en-litert-float16``: it ships as a LiteRT float16 export, which ``--quantize none``
    keeps (its weights are float16 already); another format needs a run."""
    info = ArtifactInfo.read(source)
    if format != info.format or quantize not in (Quantize.none.value, info.quantize):
        raise ConfigError(
            f"{BASE_NAME} ships as a {info.format} {info.quantize} export, which textgen export copies as it is; "
            f"for --format {format} --quantize {quantize}, fine-tune it into a run and export that: {fine_tune()}"
        )
    name = BASE_NAME.replace(":", "-")
    path = Path(path) if path is not None else default_export_path(name, info.format, info.quantize)
    _put_in_place(path, _kept(path), lambda directory: shutil.copytree(source, directory, dirs_exist_ok=True))
    return _result(BASE_NAME, path, info.format, info.quantize)


def _kept(path: Path) -> str:
    """What a failed export to ``path`` leaves there, said after its error; an error now if ``path`` holds
    something that is not an export."""
    if path.exists() and not is_artifact(path):
        raise ConfigError(f"{path} exists and is not a textgen export; choose another -o PATH or remove it")
    return f"the previous export at {path} is intact" if path.exists() else f"nothing was written to {path}"


def _put_in_place(path: Path, kept: str, write: Callable[[Path], object]) -> None:
    """An export made by ``write`` in a scratch directory beside ``path``, then put at ``path`` in one rename (an
    earlier export there replaced): a failed write (a full disk, TensorFlow's errors too) leaves what ``kept``
    says, and no scratch files."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(path)
        building = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        try:
            with _held(building):
                umask = os.umask(0)
                os.umask(umask)
                building.chmod(0o777 & ~umask)  # an ordinary directory to ship, not mkdtemp's private 0700
                write(building)
                _replace_directory(building, path)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    except (OSError, tf.errors.OpError, ConverterError) as exc:
        raise CheckpointError(f"export failed: {_reason(exc)} (writing {path}); {kept}") from None


def _result(name: str, path: Path, format: str, quantize: str) -> ExportResult:
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return ExportResult(name, path, format, quantize, size)


def _generator_options(format: str) -> dict[str, Any]:
    """How an export's sampler is built: the embedding and the input kernel kept apart (see ``Generator``), and for
    LiteRT one recurrent matmul per step (the column blocks that help TensorFlow's executor do not help it)."""
    return {"recurrent_blocks": 1 if format == ExportFormat.litert.value else RECURRENT_BLOCKS, "input_table": False}


def _reason(exc: Exception) -> str:
    """Why writing an export failed: a full disk in the same words whoever saw it (TensorFlow reports one as
    ``ResourceExhaustedError``), else the system's or TensorFlow's reason."""
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in str(exc):
        return "no space left on device"
    if isinstance(exc, OSError):
        return exc.strerror or one_line(exc)
    return one_line(exc)


def _write(generator: Generator, info: ArtifactInfo, directory: Path, check_stop: Callable[[], None]) -> None:
    """The export's files in ``directory``, its manifest last; ``check_stop`` between the long steps."""
    module, signatures = export_module(generator)
    if info.format == ExportFormat.savedmodel.value:
        tf.saved_model.save(module, str(directory), signatures=signatures)
    else:
        # The step is converted from a SavedModel written beside the export, so that it fills the same disk and
        # goes with the scratch directory.
        step = directory / ".step"
        tf.saved_model.save(module, str(step), signatures={STEP_SIGNATURE: signatures[STEP_SIGNATURE]})
        check_stop()
        (directory / LITERT_FILE).write_bytes(litert_bytes(str(step), info.quantize))
        shutil.rmtree(step)
    start = generator.start or Start(generator.zero_states(1))  # zeros for a run whose start could not be computed
    save_start(directory / START_FILE, start, "")  # the manifest checks it; no weights file to belong to
    (directory / INFO_FILE).write_text(info.to_json(), encoding="utf-8")
    write_manifest(directory)


def litert_bytes(saved_model: str, quantize: str) -> bytes:
    """The ``step`` signature of ``saved_model`` converted to LiteRT, with ``quantize``'s weights."""
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model, signature_keys=[STEP_SIGNATURE])
    if quantize != Quantize.none.value:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]  # alone: dynamic-range int8
    if quantize == Quantize.float16.value:
        converter.target_spec.supported_types = [tf.float16]
    result: bytes = converter.convert()
    return result


def export_module(generator: Generator) -> tuple[tf.Module, dict[str, tf.types.experimental.GenericFunction]]:
    """A ``tf.Module`` holding the sampler's functions, and the serving signatures (see the module docstring)."""
    cfg, vocab = generator.cfg, generator.vocab
    names = state_names(cfg.layers)
    state_specs = [tf.TensorSpec([None, cfg.units], tf.float32, name=n) for n in names]
    start_logits = None if generator.start_logits is None else tf.constant(generator.start_logits, tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="ids"), *state_specs], autograph=False)
    def step(ids: tf.Tensor, *states: tf.Tensor) -> dict[str, tf.Tensor]:
        logits, new_states = generator.step(ids, states)
        return {"logits": logits, **dict(zip(names, new_states, strict=True))}

    @tf.function(
        autograph=False,
        input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="prompt"),
            tf.TensorSpec([], tf.int32, name="length"),
            tf.TensorSpec([], tf.float32, name="temperature"),
            tf.TensorSpec([], tf.int32, name="top_k"),
            tf.TensorSpec([], tf.float32, name="top_p"),
            tf.TensorSpec([], tf.int32, name="seed"),
        ],
    )
    def generate(prompt: tf.Tensor, length: tf.Tensor, temperature: tf.Tensor, top_k: tf.Tensor, top_p: tf.Tensor,
                 seed: tf.Tensor) -> dict[str, tf.Tensor]:  # fmt: skip
        checks = [tf.debugging.assert_positive(length, message="length must be at least 1")]
        if start_logits is None:  # a run's start from before its logits were kept: nothing to draw an empty one from
            checks.append(
                tf.debugging.assert_positive(tf.shape(prompt)[1], message="the prompt must hold at least one id")
            )
        # Without the dependency the graph may run the draw loop first, and a length of 0 then fails inside it
        # with TensorFlow's own message instead of this one (it did so once in CI).
        with tf.control_dependencies(checks):
            prompt, length = tf.identity(prompt), tf.identity(length)
        # Every prompt is read from the start state, as textgen sample reads it (textgen.startstate).
        batch = tf.shape(prompt)[:1]
        starts = tuple(tf.repeat(tf.constant(s, tf.float32), batch, axis=0) for s in generator.start_states(1))
        logits, states = generator.feed_function(prompt, starts)
        if start_logits is not None:  # an empty prompt draws from the start's logits, as textgen sample does
            logits = tf.where(tf.shape(prompt)[1] > 0, logits, tf.repeat(start_logits, batch, axis=0))
        # The graph's own seeded stream (textgen's uniforms are made in NumPy, outside the graph).
        draws = tf.random.stateless_uniform(tf.stack([length, tf.shape(prompt)[0]]), tf.stack([seed, 0]))
        ids, _, _ = generator.generate_function(
            logits, states, draws, tf.fill(batch, temperature), tf.fill(batch, top_k), tf.fill(batch, top_p)
        )
        return {"ids": ids}

    chars = tf.constant([UNKNOWN_CHAR, *vocab.chars])

    @tf.function(input_signature=[], autograph=False)
    def vocabulary() -> dict[str, tf.Tensor]:
        return {"chars": chars}

    module = tf.Module()
    module.feed, module.generate_chunk = generator.feed_function, generator.generate_function
    module.generate_forced = generator.forced_function  # textgen serve's: prompts read inside the chunk
    module.generate_penalized = generator.penalized_function  # rows with penalties or a logit bias
    module.step, module.generate, module.vocabulary = step, generate, vocabulary
    return module, {STEP_SIGNATURE: step, "generate": generate, "vocabulary": vocabulary}


def _replace_directory(new: Path, path: Path) -> None:
    """Put directory ``new`` at ``path``, replacing an earlier export there (a rename each way; the earlier one
    is put back if the second fails)."""
    fsync_tree(new)
    if not path.exists():
        os.replace(new, path)
        fsync_path(path.parent)
        return
    old = path.parent / f".{path.name}.old-{secrets.token_hex(4)}"
    with _held(path):  # moved aside, it is still this export's to put back: no other export's clean-up takes it
        os.replace(path, old)
        try:
            os.replace(new, path)
        except OSError:
            os.replace(old, path)
            raise
        fsync_path(path.parent)
        shutil.rmtree(old, ignore_errors=True)


# What an export writes beside its path: its scratch directory (mkdtemp's 8 characters), and the earlier export
# while it is replaced. A killed export leaves them; the next export to the path removes them.
_LEFTOVER = r"\.{name}\.(old-[0-9a-f]{{8}}|[a-z0-9_]{{8}})"


@contextlib.contextmanager
def _held(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` while the block runs: a running export's mark on what it writes
    beside its path. The kernel drops it when the process ends, however it ends (kill -9 included)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_leftovers(path: Path) -> None:
    """Remove what killed exports to ``path`` left beside it; what a running one holds (``_held``) stays."""
    leftover = re.compile(_LEFTOVER.format(name=re.escape(path.name)))
    for entry in path.parent.iterdir():
        if not leftover.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):  # held by a running export (BlockingIOError), or already gone
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(entry)
            finally:
                os.close(fd)


# --- reading a float export's weights back (train --init-from EXPORT) ---------------------------------------


def export_base(path: Path, scratch: Path) -> Base:
    """The weights a float export was written from, as a run's that ``train --init-from`` starts from: read out
    of the network's constants into a Keras weights file in ``scratch``, and checked to give the export's own
    logits on a probe text, so that a misread array is refused rather than trained on."""
    from textgen.runtime import open_artifact

    sampler, info = open_artifact(path, inference=False)
    model = build_model(info.model, batch_size=1, stateful=False)
    refused = f"give the run it was exported from, --init-from {info.run}"
    weights_file = scratch / "export.weights.h5"
    try:
        model.set_weights(_place(_network_constants(path, info.format), _placement(info), len(model.weights)))
        probe = np.random.default_rng(0).integers(1, info.vocab.size, size=(2, 48), dtype=np.int32)
        want, _ = sampler.read(probe, sampler.zero_states(len(probe)))
        got = np.asarray(model(probe, training=False))[:, -1]
        if not np.abs(got - want).max() <= PROBE_TOLERANCE * max(1.0, float(np.abs(want).max())):
            raise ConfigError(f"the weights read out of {path} do not reproduce its logits; {refused}")
        model.save_weights(str(weights_file))
    except ValueError as exc:  # an array of the model missing, or of another shape
        raise ConfigError(f"cannot read float weights out of {path} ({one_line(exc)}); {refused}") from None
    except (OSError, tf.errors.OpError, ConverterError) as exc:
        raise CheckpointError(f"reading the weights out of {path} failed: {_reason(exc)}") from None
    base = is_base_dir(path)
    return Base(
        source=Path(BASE_NAME) if base else path.resolve(),  # the package's, wherever it is installed
        name=BASE_NAME if base else info.run,
        weights=Weights(info.weights),
        weights_file=weights_file,
        vocab=info.vocab,
        model=info.model,
        corpus=None,
        val_loss=None,
        export=info.format if info.quantize == Quantize.none.value else f"{info.format} {info.quantize}",
    )


# The export's logits and the Keras model's from the same float32 arrays differ by summation order only: ~1e-6
# relative on the default model; a misplaced array is off by whole units.
PROBE_TOLERANCE = 1e-4
Placement = dict[str, tuple[int, bool]]  # a constant's key -> (the model array it is part of, transposed)


def _placement(info: ArtifactInfo) -> Placement:
    """Where each constant of an export like ``info``'s goes in the model, learnt by exporting a small model of
    the same kind whose array i holds i + a ramp below 0.25 (no two entries alike, so nothing is folded away). A
    SavedModel's step captures the arrays in the order it reads them, a recurrent kernel as four column blocks;
    a LiteRT file keeps each matmul's kernel transposed, under a name the converter chose."""
    # Small, so that the export takes a second; its arrays are told apart by their values, not their shapes.
    cfg = dataclasses.replace(info.model, vocab_size=5, embedding_dim=3, units=4)
    vocab = Vocabulary(tuple("abcd"))
    shapes = [tuple(w.shape) for w in build_model(cfg, batch_size=1, stateful=False).weights]
    marked = [i + 0.25 * np.arange(np.prod(s), dtype=np.float32).reshape(s) / np.prod(s) for i, s in enumerate(shapes)]
    generator = Generator(cfg, vocab, marked, **_generator_options(info.format))
    small = dataclasses.replace(info, model=cfg, vocab=vocab)
    with tempfile.TemporaryDirectory(prefix="textgen-marked-") as directory:
        _write(generator, small, Path(directory), lambda: None)
        constants = _network_constants(Path(directory), info.format)
    placement = {}
    for key, array in constants:
        slot = int(np.floor(array.min()))
        if 0 <= slot < len(shapes) and array.ndim == len(shapes[slot]):
            shape = shapes[slot]
            if array.shape == shape[::-1] and array.shape != shape:
                placement[key] = (slot, True)
            elif array.shape[0] == shape[0]:  # the array, or a column block of it
                placement[key] = (slot, False)
    return placement


def _place(constants: list[tuple[str, np.ndarray]], placement: Placement, count: int) -> list[np.ndarray]:
    """The model's ``count`` arrays from an export's constants: each placed, transposed back, and a kernel's
    column blocks joined in order."""
    parts: list[list[np.ndarray]] = [[] for _ in range(count)]
    for key, array in constants:
        if key in placement:
            slot, transposed = placement[key]
            parts[slot].append(array.T if transposed else array)
    missing = [i for i, part in enumerate(parts) if not part]
    if missing:
        raise ValueError(f"{len(missing)} of the model's {count} arrays are not among its constants")
    return [part[0] if len(part) == 1 else np.concatenate(part, axis=1) for part in parts]


def _network_constants(path: Path, format: str) -> list[tuple[str, np.ndarray]]:
    """The float arrays of an export's step, each with a key that names its place: a SavedModel's by the order its
    step captured them, a LiteRT file's by name (float16 ones widened)."""
    if format == ExportFormat.savedmodel.value:
        step = tf.saved_model.load(str(path)).signatures[STEP_SIGNATURE]
        return [(str(i), t.numpy()) for i, t in enumerate(step.captured_inputs) if t.dtype == tf.float32]
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path / LITERT_FILE))
    constants = []
    for detail in interpreter.get_tensor_details():
        if detail["dtype"] not in (np.float32, np.float16) or len(detail["shape"]) == 0:
            continue
        try:
            array = interpreter.get_tensor(detail["index"])
        except ValueError:  # an activation: no data before the interpreter runs
            continue
        constants.append((detail["name"], array.astype(np.float32)))
    return constants
