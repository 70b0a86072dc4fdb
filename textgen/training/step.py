"""The model, its optimizer and its compiled training step under a ``tf.distribute`` strategy: the arithmetic of one
update, with gradient accumulation, weight-drop, distillation's soft targets and pruning's masks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from textgen.checkpoint import Run
from textgen.config import RunConfig, TrainConfig, Weights
from textgen.errors import ConfigError
from textgen.fastlstm import dropout, mask_seed
from textgen.model import LAYER_NORM_WEIGHTS, build_model, lstm_layers, reset_states
from textgen.scoring import EvalStep, compile_eval_step, model_logits, summed_cross_entropy
from textgen.training.pruning import prunable_kernels
from textgen.training.warmstart import freeze


@dataclass
class Trainer:
    """A model with its optimizer and compiled steps, under a ``tf.distribute`` strategy."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    train_step: Callable[[Any, Any], tf.Tensor]  # (inputs, targets) per replica -> mean loss, after one update
    eval_step: EvalStep  # (inputs, targets) per replica -> summed loss
    strategy: tf.distribute.Strategy
    group_states: list[list[keras.Variable]]  # with --accumulate, each group's copy of the LSTM states
    teacher: keras.Model | None = None  # ``textgen distill``'s teacher, reading the same streams
    masks: list[tuple[keras.Variable, keras.Variable]] = field(default_factory=list)  # (kernel, mask) when pruning
    # The update without weight-drop, for a run's first ``ModelConfig.weight_drop_after`` epochs (None: no such epochs).
    plain_step: Callable[[Any, Any], tf.Tensor] | None = None
    weight_drop_after: int = 0

    def step_for(self, epoch: int) -> Callable[[Any, Any], tf.Tensor]:
        """The update of epoch ``epoch`` (from 0): without weight-drop until it starts."""
        if self.plain_step is not None and epoch < self.weight_drop_after:
            return self.plain_step
        return self.train_step

    def stream_states(self) -> list[keras.Variable]:
        """Every LSTM state the streams carry from one batch to the next: the model's, the teacher's and each
        accumulation group's."""
        models = [self.model, *([self.teacher] if self.teacher is not None else [])]
        lstms = [layer for m in models for layer in lstm_layers(m)]
        return [v for layer in lstms for v in layer.states] + [v for group in self.group_states for v in group]

    def reset_states(self) -> None:
        """Zero the LSTM states, every accumulation group's and the teacher's included."""
        reset_states(self.model)
        if self.teacher is not None:
            reset_states(self.teacher)
        for group in self.group_states:
            for state in group:
                state.assign(tf.zeros_like(state))


def build_trainer(cfg: RunConfig, strategy: tf.distribute.Strategy | None = None) -> Trainer:
    """The model, optimizer and compiled train/eval steps that ``train`` uses (and the benchmarks time).

    Steps run through ``strategy.run`` on each replica's rows of a batch. With ``--accumulate N`` a
    replica's rows are N groups of streams, each with its own LSTM states (swapped into the model's in
    turn), whose gradients are summed into one update: the update of an N times bigger batch with the
    activation memory of one group. With the profile's ``fast_lstm`` the LSTM runs through
    ``textgen.fastlstm`` on the same variables. A distilled run (``cfg.distill``) also learns the teacher's
    softened predictions; a pruned run (``cfg.prune``) multiplies its kernels by their masks after every update.
    """
    strategy = strategy or tf.distribute.get_strategy()
    groups, precision = cfg.training.accumulate, cfg.profile.precision
    replica_batch = cfg.data.batch_size // strategy.num_replicas_in_sync
    with strategy.scope():
        model = build_model(cfg.model, replica_batch, precision)
        if cfg.init_from:
            freeze(model, cfg.init_from.freeze)
        optimizer = make_optimizer(cfg.training)
        if precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer)  # callbacks reach the optimizer through model.optimizer
        optimizer.build(model.trainable_variables)
        lstm_states = [v for layer in lstm_layers(model) for v in layer.states]
        group_states = [
            [keras.Variable(tf.zeros_like(v), trainable=False, name=f"group_{g}_state") for v in lstm_states]
            for g in range(groups if groups > 1 else 0)
        ]
        teacher = _teacher_model(cfg, replica_batch) if cfg.distill else None
        masks = [
            (kernel, keras.Variable(tf.ones_like(kernel), trainable=False, name=f"mask_{i}"))
            for i, kernel in enumerate(prunable_kernels(model) if cfg.prune else [])
        ]
    parts = Trainer(model, optimizer, _not_compiled, compile_eval_step(model, cfg.profile, strategy), strategy,
                    group_states, teacher, masks)  # fmt: skip
    rate, after = cfg.model.weight_drop, cfg.model.weight_drop_after
    # Each step is traced when first called: a run that never reaches its weight-drop never traces that step.
    plain_step = _compile_train_step(cfg, parts, 0.0) if rate > 0 and after > 0 else None
    return dataclasses.replace(parts, train_step=_compile_train_step(cfg, parts, rate), plain_step=plain_step,
                               weight_drop_after=after)  # fmt: skip


def _not_compiled(x: Any, y: Any) -> tf.Tensor:
    raise AssertionError("build_trainer returns its trainer with the compiled step")


def _compile_train_step(cfg: RunConfig, parts: Trainer, weight_drop: float) -> Callable[[Any, Any], tf.Tensor]:
    """One update on a batch with recurrent kernels dropped at ``weight_drop``, as a tf.function over the replicas
    of ``parts`` (a trainer whose step is not yet compiled): the gradients of each accumulation group (its own LSTM
    states swapped in) summed and applied, then the pruning masks applied again."""
    model, optimizer, teacher, strategy = parts.model, parts.optimizer, parts.teacher, parts.strategy
    groups, profile, seed0 = cfg.training.accumulate, cfg.profile, cfg.training.seed
    chars_per_update = cfg.data.batch_size * groups * cfg.data.seq_len
    lstm_states = [v for layer in lstm_layers(model) for v in layer.states]

    def group_gradients(x: tf.Tensor, y: tf.Tensor, group: int) -> tuple[tf.Tensor, list[tf.Tensor]]:
        # The fast LSTM draws its dropout masks from (seed, step, group): a resumed run draws what an
        # uninterrupted one would. (Keras' own LSTM, on the GPU profile, ignores it.)
        step = tf.cast(optimizer.iterations, tf.int64) * groups + group
        replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int64)
        seed = tf.stack([tf.constant(seed0, tf.int64) + replica * 2**32, step])  # each replica its own masks
        teacher_logits = model_logits(teacher, profile, x, False) if teacher is not None else None
        # Weight-drop's masks: one per update, the same for every group and replica (no replica in the seed).
        update = tf.cast(optimizer.iterations, tf.int64)
        update_seed = tf.stack([tf.constant(seed0 + WEIGHT_DROP_SEED, tf.int64), update])
        with tf.GradientTape() as tape, recurrent_kernels_dropped(model, weight_drop, update_seed):
            logits = model_logits(model, profile, x, True, seed)
            loss = summed_cross_entropy(y, logits) / chars_per_update
            objective = loss
            if teacher_logits is not None and cfg.distill is not None:
                soft = soft_cross_entropy(teacher_logits, logits, cfg.distill.temperature) / chars_per_update
                objective = cfg.distill.alpha * loss + (1.0 - cfg.distill.alpha) * soft
            scaled = optimizer.scale_loss(objective)
        return loss, tape.gradient(scaled, model.trainable_variables)

    def replica_train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        if groups == 1:
            loss, gradients = group_gradients(x, y, 0)
        else:
            rows, loss, gradients = x.shape[0] // groups, tf.constant(0.0), None
            for g, states in enumerate(parts.group_states):
                for state, saved in zip(lstm_states, states, strict=True):
                    state.assign(saved)
                part_loss, part = group_gradients(x[g * rows : (g + 1) * rows], y[g * rows : (g + 1) * rows], g)
                for state, saved in zip(lstm_states, states, strict=True):
                    saved.assign(state)
                part = [tf.convert_to_tensor(p) for p in part]  # the embedding's IndexedSlices, made dense
                loss += part_loss
                gradients = part if gradients is None else [a + b for a, b in zip(gradients, part, strict=True)]
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    # Every textgen tf.function is traced without AutoGraph: their loops and branches are tf.while_loop and
    # tf.cond already, and converting the Python cost each process ~1 s (a fresh `textgen sample --length 1`:
    # 4.89 -> 4.19 s; a tiny one-epoch `textgen train`: 7.99 -> 6.60 s; medians of 5 alternating pairs).
    @tf.function(jit_compile=profile.jit_compile, autograph=False)
    def train_step(x: Any, y: Any) -> tf.Tensor:
        loss = strategy.reduce("SUM", strategy.run(replica_train_step, args=(x, y)), axis=None)
        for kernel, mask in parts.masks:  # pruned weights stay exactly zero whatever the optimizer's moments say
            kernel.assign(kernel * mask)
        return loss

    return train_step


WEIGHT_DROP_SEED = 2**40  # apart from the input and output masks' seeds (seed + replica x 2**32)


@contextlib.contextmanager
def recurrent_kernels_dropped(model: keras.Model, rate: float, seed: tf.Tensor) -> Iterator[None]:
    """Weight-drop (Merity et al., 2017) while open: every LSTM reads its recurrent kernel through a DropConnect mask
    drawn from ``seed``, the kept weights scaled by 1 / (1 - ``rate``), one mask for every timestep and stream.

    The cells' ``recurrent_kernel`` attributes are swapped for the masked tensors, not the variables' values (as
    AWD-LSTM's WeightDrop swaps a module's weight): Keras' LSTM (cuDNN or its loop), the layer-normalized cell and the
    fast path all read the attribute, so they draw the same mask, and the gradient reaches the variable through the
    product. The optimizer, the checkpoints and every step but training's see only the variables. Open it within
    the gradient tape, which must see the masks applied."""
    cells = [layer.cell for layer in lstm_layers(model)] if rate > 0 else []
    kernels = [cell.recurrent_kernel for cell in cells]
    for n, (cell, kernel) in enumerate(zip(cells, kernels, strict=True)):
        dropped = dropout(tf.convert_to_tensor(kernel), rate, tf.shape(kernel), mask_seed(seed, n))
        # Cast as Keras casts a variable it reads under mixed precision; set past Keras' tracking of attributes.
        object.__setattr__(cell, "recurrent_kernel", tf.cast(dropped, cell.compute_dtype))
    try:
        yield
    finally:
        for cell, kernel in zip(cells, kernels, strict=True):
            object.__setattr__(cell, "recurrent_kernel", kernel)


def make_optimizer(tcfg: TrainConfig) -> keras.optimizers.Optimizer:
    """The run's optimizer, with global-norm clipping and decoupled weight decay on everything but the biases and
    layer normalization's gains and shifts (decay would pull a gain towards zero, not towards the identity)."""
    # Keras' other optimizers take None for no decay; AdamW insists on a number.
    decay = tcfg.weight_decay if tcfg.optimizer == "adamw" else tcfg.weight_decay or None
    settings = {"learning_rate": tcfg.lr, "global_clipnorm": tcfg.clip_norm, "weight_decay": decay}
    optimizer: keras.optimizers.Optimizer
    if tcfg.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(momentum=tcfg.momentum, nesterov=tcfg.momentum > 0, **settings)
    else:
        kind = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW, "rmsprop": keras.optimizers.RMSprop}
        optimizer = kind[tcfg.optimizer](**settings)
    if tcfg.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=["bias", *LAYER_NORM_WEIGHTS])
    return optimizer


def _teacher_model(cfg: RunConfig, batch: int) -> keras.Model:
    """The teacher of a distilled run, with its best weights, stateful on the student's streams."""
    assert cfg.distill is not None
    teacher_run = Run(Path(cfg.distill.teacher))
    recorded, now = cfg.distill.teacher_val_loss, teacher_run.best_weights_loss()
    if recorded is not None and now != recorded:  # its soft targets would change in the middle of the run
        raise ConfigError(
            f"the teacher run {teacher_run.name!r} has other best weights than when this student started "
            f"(validation loss {recorded:.4f} then, {now:.4f} now); start a new student: textgen distill --teacher "
            f"{teacher_run.name}"
        )
    teacher_cfg = teacher_run.load_config()
    teacher = build_model(teacher_cfg.model, batch, cfg.profile.precision)
    teacher_run.load_weights(teacher, Weights.best)
    return teacher


def soft_cross_entropy(teacher_logits: tf.Tensor, logits: tf.Tensor, temperature: float) -> tf.Tensor:
    """Distillation's soft-target term, summed over characters: T^2 x the cross-entropy of the student's
    predictions against the teacher's, both at temperature T (Hinton et al., 2015; T^2 keeps its gradients on
    the scale of the hard term's as T changes). The teacher gets no gradient."""
    soft_targets = tf.stop_gradient(tf.nn.softmax(teacher_logits / temperature))
    return temperature**2 * tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(soft_targets, logits / temperature))
