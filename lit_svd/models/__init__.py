"""Loading Hugging Face causal LMs and one weight view per architecture family."""
from lit_svd.models.loading import ModelUnavailableError, load_causal_lm, load_tokenizer

__all__ = ["ModelUnavailableError", "load_causal_lm", "load_tokenizer"]
