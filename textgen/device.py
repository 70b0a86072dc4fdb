"""Device profiles: named bundles of settings for the CPU and the GPU.

``apply_profile`` must run before TensorFlow creates its runtime: thread counts
cannot change afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from textgen.config import Device, DeviceProfile
from textgen.errors import ConfigError, DeviceError

# Each choice measured with benchmarks/train_throughput.py and benchmarks/sampling.py on 2 cores.
CPU = DeviceProfile(
    name=Device.cpu,
    precision="float32",  # bf16 was measured slower, with AMX and without (docs/performance.md)
    batch_size=64,
    # Training: the fast LSTM's large matmuls want both cores in one op (2 intra-op threads):
    # 14,500 chars/s against 12,000 with 1 intra x 2 inter, and 11,400 for Keras' LSTM.
    intra_op_threads=2,
    inter_op_threads=1,
    jit_compile=False,  # on the whole step: +1-2%, for a compile per shape; the fast LSTM compiles its recurrences
    fast_lstm=True,
    # Sampling: many small ops, so 1 intra-op x 2 inter-op threads: ~2x TensorFlow's defaults at batch 1.
    sample_intra_op_threads=1,
    sample_inter_op_threads=2,
    notes="fp32, textgen's fast LSTM training step (its recurrences compiled with XLA), 2 intra-op threads (1 x 2 for sampling)",
)

GPU = DeviceProfile(
    name=Device.gpu,
    precision="mixed_float16",  # logits stay float32
    batch_size=256,
    intra_op_threads=0,
    inter_op_threads=0,
    # The cuDNN LSTM kernel is not XLA-compilable (Keras turns XLA off for it), so the
    # train step runs without jit_compile; the LSTM layers keep cuDNN-eligible arguments.
    jit_compile=False,
    notes="mixed_float16 with float32 logits, cuDNN LSTM kernel (Keras' generic loop with --layer-norm), batch 256",
)

PROFILES = {p.name: p for p in (CPU, GPU)}


DEVICE_CHOICES = tuple(d.value for d in Device)


def import_tensorflow() -> None:
    """Import TensorFlow (and Keras) with its C++ start-up chatter kept off the terminal.

    Some of it is printed before TF_CPP_MIN_LOG_LEVEL is read, so stderr is muted during the
    import unless the user set TF_CPP_MIN_LOG_LEVEL themselves.
    """
    if "tensorflow" in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        import keras

        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    with native_stderr_silenced():
        import keras  # noqa: F401


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null: what native code logs there is dropped (Python's errors are not)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def gpus_visible() -> bool:
    """Whether TensorFlow sees a GPU (imports TensorFlow, does not initialise its runtime)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def resolve_profile(device: str | Device) -> DeviceProfile:
    """The profile for ``--device``: ``auto`` picks ``gpu`` when a GPU is visible."""
    if device not in DEVICE_CHOICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICE_CHOICES)} (got {device!r})")
    device = Device(device)
    if device is Device.auto:
        return GPU if gpus_visible() else CPU
    if device is Device.gpu and not gpus_visible():
        raise DeviceError(
            "--device gpu: TensorFlow sees no GPU here; install the CUDA build with "
            "pip install -e '.[gpu]' on a machine with an NVIDIA GPU, or use --device cpu"
        )
    return PROFILES[device]


def apply_profile(profile: DeviceProfile, sampling: bool = False, threads: int | None = None) -> None:
    """Set TensorFlow's thread pools for training (or ``sampling``) under ``profile``; ``threads`` overrides
    its intra-op threads (``--threads``: e.g. one per worker when several share a machine).

    A no-op if the runtime already started (a second run in one process keeps its pools).
    """
    import tensorflow as tf

    intra, inter = (
        (profile.sample_intra_op_threads, profile.sample_inter_op_threads)
        if sampling
        else (profile.intra_op_threads, profile.inter_op_threads)
    )
    intra = threads or intra
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        pass


def configure_for_inference() -> DeviceProfile:
    """Set this machine's profile's sampling thread pools (for sample, repl, evaluate); return it."""
    profile = resolve_profile("auto")
    apply_profile(profile, sampling=True)
    return profile
