"""A weights file (Keras' ``.weights.h5``) saved with a SHA-256 of its arrays, and checked against it: HDF5 checks
only its own structure, so a flipped bit in the weights would otherwise load."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from textgen.errors import one_line

if TYPE_CHECKING:
    import keras

WEIGHTS_DIGEST = "textgen_sha256"  # the attribute of a weights file that holds its arrays' checksum


def save_weights(model: keras.Model, path: Path, **attrs: Any) -> None:
    """Save the model's variables only (Keras' ``save_weights`` adds the attached optimizer's, Adam's moments twice
    the model, which the resume point keeps in its own file), with ``attrs`` and the arrays' checksum."""
    import h5py
    import keras

    keras.saving.save_weights(model, path, objects_to_skip=[getattr(model, "optimizer", None)])
    with h5py.File(path, "a") as fh:
        fh.attrs.update({**attrs, WEIGHTS_DIGEST: _digest(fh)})


def checked_checksum(path: Path) -> str:
    """The checksum of a weights file's arrays, once they match the one saved with them (files from before it was
    saved have none: they are taken as they are); ``ValueError`` saying what is wrong with a damaged file."""
    import h5py

    try:
        with h5py.File(path, "r") as fh:
            saved, actual = fh.attrs.get(WEIGHTS_DIGEST), _digest(fh)
    except Exception as exc:  # h5py raises many kinds for a damaged file (OSError for a truncated one)
        raise ValueError(one_line(exc)) from None
    if saved is not None and str(saved) != actual:
        raise ValueError("its weights differ from the checksum saved with them")
    return actual


def weights_checksum(path: Path) -> str:
    """The checksum of a weights file's arrays: the one saved with them (computed, for a file from before)."""
    import h5py

    with h5py.File(path, "r") as fh:
        return str(fh.attrs.get(WEIGHTS_DIGEST) or _digest(fh))


def _digest(fh: Any) -> str:
    """A SHA-256 of every array in an open weights file, by name."""
    import h5py

    digest = hashlib.sha256()

    def add(name: str, item: Any) -> None:
        if isinstance(item, h5py.Dataset):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(item[()]).tobytes())

    fh.visititems(add)
    return digest.hexdigest()
