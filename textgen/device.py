"""Device profiles: named bundles of settings for the CPU and the GPU.

``apply_profile`` must run before TensorFlow creates its runtime: thread counts
cannot change afterwards.
"""

from __future__ import annotations

from textgen.config import DeviceProfile
from textgen.errors import ConfigError, DeviceError

CPU = DeviceProfile(
    name="cpu",
    precision="float32",  # bf16/fp16 and XLA were measured slower on CPUs without AMX
    batch_size=64,
    intra_op_threads=1,
    inter_op_threads=2,
    jit_compile=False,
    notes="fp32, 1 intra-op x 2 inter-op threads (fastest measured on 2 cores), no XLA",
)

GPU = DeviceProfile(
    name="gpu",
    precision="mixed_float16",  # logits stay float32
    batch_size=256,
    intra_op_threads=0,
    inter_op_threads=0,
    # The cuDNN LSTM kernel is not XLA-compilable (Keras turns XLA off for it), so the
    # train step runs without jit_compile; the LSTM layers keep cuDNN-eligible arguments.
    jit_compile=False,
    notes="mixed_float16 with float32 logits, cuDNN LSTM kernel, batch 256",
)

PROFILES = {p.name: p for p in (CPU, GPU)}
DEVICE_CHOICES = ("auto", *PROFILES)


def gpus_visible() -> bool:
    """Whether TensorFlow sees a GPU (imports TensorFlow, does not initialise its runtime)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def resolve_profile(device: str) -> DeviceProfile:
    """The profile for ``--device``: ``auto`` picks ``gpu`` when a GPU is visible."""
    if device not in DEVICE_CHOICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICE_CHOICES)} (got {device!r})")
    if device == "auto":
        return GPU if gpus_visible() else CPU
    if device == "gpu" and not gpus_visible():
        raise DeviceError(
            "--device gpu: TensorFlow sees no GPU here; install the CUDA build with "
            "pip install -e '.[gpu]' on a machine with an NVIDIA GPU, or use --device cpu"
        )
    return PROFILES[device]


def apply_profile(profile: DeviceProfile) -> None:
    """Set TensorFlow's thread pools for ``profile``; a no-op if the runtime already started."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(profile.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(profile.inter_op_threads)
    except RuntimeError:
        pass  # the runtime is already up (a second run in one process): keep its pools


def configure_for_inference() -> DeviceProfile:
    """Set this machine's profile's thread pools for sampling and evaluation; return the profile.

    On the CPU profile's pools (1 intra-op x 2 inter-op) batch-1 sampling ran ~2x faster
    than on TensorFlow's defaults: small matmuls split over two threads cost more than they gain.
    """
    profile = resolve_profile("auto")
    apply_profile(profile)
    return profile
