"""Generation from an exported ``.tflite`` model on the LiteRT interpreter (``ai-edge-litert``), without TensorFlow.

The model is ``textgen export``'s next-token step, ``(ids, h_0, c_0, ...) -> (logits, h_0, c_0, ...)``,
with the batch size a runtime input; the loop around it and the sampling strategy
(``textgen.npsampling``, the NumPy twin of ``textgen.sampling.choose_next``) run in NumPy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from textgen.artifact import STEP_SIGNATURE, check_step, state_names
from textgen.config import ModelConfig
from textgen.device import native_stderr_silenced
from textgen.errors import ConfigError, one_line
from textgen.generation import RowSettings, Sampler, States, count_drawn
from textgen.npsampling import choose_next
from textgen.vocab import Vocabulary


class LiteRTGenerator(Sampler):
    """``Sampler``'s two steps on a LiteRT next-token model."""

    def __init__(self, cfg: ModelConfig, vocab: Vocabulary, path: Path) -> None:
        super().__init__(cfg, vocab)
        from ai_edge_litert.interpreter import Interpreter

        self.path = path
        # One thread: a step of the default model takes ~15 us at batch 1 on one core with int8 weights and
        # ~30 us on two (the threads' hand-off costs more than the arithmetic).
        try:
            self.interpreter = Interpreter(model_path=str(path), num_threads=1)
            signature = self.interpreter.get_signature_runner(STEP_SIGNATURE)
            inputs, outputs = signature.get_input_details(), signature.get_output_details()
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"{path} is not a model textgen exported ({one_line(exc)}); export the run again"
            ) from None
        del signature  # it holds views of the interpreter's buffers, which would block invoke()
        check_step(path, cfg, _widths(inputs), _widths(outputs))
        names = state_names(cfg.layers)
        self.ids_input, self.logits_output = inputs["ids"]["index"], outputs["logits"]["index"]
        self.state_inputs = [inputs[n]["index"] for n in names]
        self.state_outputs = [outputs[n]["index"] for n in names]
        self.batch = 0

    def _resize(self, batch: int) -> None:
        if batch != self.batch:
            self.interpreter.resize_tensor_input(self.ids_input, [batch])
            for index in self.state_inputs:
                self.interpreter.resize_tensor_input(index, [batch, self.cfg.units])
            with native_stderr_silenced():  # the runtime announces its XNNPACK delegate on the first allocation
                try:
                    self.interpreter.allocate_tensors()
                except RuntimeError as exc:
                    raise self._failed(exc) from None
            self.batch = batch

    def _failed(self, exc: RuntimeError) -> ConfigError:
        """An error of the interpreter or its delegate (XNNPACK) as one line naming the file."""
        return ConfigError(f"LiteRT failed running {self.path} ({one_line(exc)})")

    def step(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        """Logits (B, V) after reading ``ids`` (B,), and the new states."""
        interpreter = self.interpreter
        self._resize(len(ids))
        interpreter.set_tensor(self.ids_input, ids)
        for index, state in zip(self.state_inputs, states, strict=True):
            interpreter.set_tensor(index, state)
        try:
            interpreter.invoke()
        except RuntimeError as exc:  # a try costs nothing until it raises: this is the per-character loop
            raise self._failed(exc) from None
        new_states = tuple(interpreter.get_tensor(index) for index in self.state_outputs)
        return interpreter.get_tensor(self.logits_output), new_states

    def read(self, ids: np.ndarray, states: States) -> tuple[np.ndarray, States]:
        ids = np.ascontiguousarray(ids, np.int32)
        logits = np.zeros([len(ids), self.vocab.size], np.float32)
        for t in range(ids.shape[1]):
            logits, states = self.step(ids[:, t], states)
        return logits, states

    def generate_steps(
        self,
        logits: np.ndarray,
        states: States,
        uniforms: np.ndarray,
        settings: RowSettings,
        forced: np.ndarray | None = None,
        counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, States]:
        out = np.empty([len(logits), len(uniforms)], np.int32)
        p = settings.penalties
        if p is not None and counts is None:
            raise ValueError("penalties need the rows' counts so far")
        for t, u in enumerate(uniforms):
            if forced is not None and (forced[t] >= 0).all():  # every row reads its prompt: nothing to draw
                ids = forced[t]
            else:
                penalty = None if p is None or counts is None else (counts, p.frequency, p.presence, p.bias)
                ids = choose_next(logits, settings.temperature, settings.top_k, settings.top_p, u, penalty)
                if forced is not None:
                    ids = np.where(forced[t] >= 0, forced[t], ids).astype(np.int32)
                if penalty is not None:  # a prompt's forced ids are not counted
                    drawn = np.ones(len(ids), bool) if forced is None else forced[t] < 0
                    counts = count_drawn(penalty[0], ids[:, None], drawn[:, None])
            out[:, t] = ids
            logits, states = self.step(ids, states)
        return out, logits, states


def _widths(details: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The last dimension of each of a signature's tensors, by name (-1 for the batch of ids)."""
    return {name: int(d["shape_signature"][-1]) for name, d in details.items()}
