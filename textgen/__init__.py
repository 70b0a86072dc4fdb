"""textgen: train character-level LSTM language models on a book and sample from them."""

__version__ = "0.1.0"
