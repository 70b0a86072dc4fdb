"""textgen: train character-level LSTM language models on a book and sample from them."""

import os as _os

__version__ = "0.1.0"

# textgen's models are TensorFlow code: a KERAS_BACKEND of jax or torch in the user's environment (for
# their other projects) would make Keras load another backend and fail. Set before Keras is imported.
_os.environ["KERAS_BACKEND"] = "tensorflow"
