"""The options of the language-model modules and their checks, without torch: ``LanguageModelModule``'s and
``FineTuneLMModule``'s constructors and the command line's fast check (``config_check``, before torch is imported)
run the same ``check_language_model_options`` / ``check_fine_tune_options``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lit_svd.choices import check_choice, choices
from lit_svd.option_checks import check_indices, is_int

Arch = Literal["gpt2", "gpt_neox"]
ARCHS: tuple[Arch, ...] = choices(Arch)
Part = Literal["all", "attention", "mlp"]


def _check_schedule(lr: float, weight_decay: float, warmup_steps: int) -> None:
    if not lr > 0 or weight_decay < 0 or warmup_steps < 0:
        raise ValueError(
            f"model.lr={lr!r} must be > 0, weight_decay={weight_decay!r} and warmup_steps={warmup_steps!r} >= 0"
        )


def check_language_model_options(
    arch: str = "gpt2",
    n_layers: int = 2,
    d_model: int = 128,
    n_heads: int = 4,
    max_positions: int = 256,
    vocab_size: int | None = None,
    vocab_top_k: int | None = 4096,
    rotary_pct: float = 0.25,
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup_steps: int = 100,
) -> None:
    """Every option of ``LanguageModelModule``, one line naming the key otherwise (``n_layers`` / ``n_heads`` are
    the model's own sizes here, not read from a config)."""
    check_choice("model.arch", arch, Arch)
    for key, value in (
        ("n_layers", n_layers),
        ("d_model", d_model),
        ("n_heads", n_heads),
        ("max_positions", max_positions),
    ):
        if not is_int(value) or value < 1:
            raise ValueError(f"model.{key}={value!r} must be a positive integer")
    if d_model % n_heads:
        raise ValueError(f"model.d_model={d_model} is not divisible by model.n_heads={n_heads}")
    if vocab_size is not None and (not is_int(vocab_size) or vocab_size < 2):
        raise ValueError(f"model.vocab_size={vocab_size!r} must be >= 2 (or null: the datamodule tokenizer's)")
    if vocab_top_k is not None and (not is_int(vocab_top_k) or vocab_top_k < 1):
        raise ValueError(f"model.vocab_top_k={vocab_top_k!r} must be a positive integer or null")
    if not 0.0 < rotary_pct <= 1.0:
        raise ValueError(f"model.rotary_pct={rotary_pct!r} must lie in (0, 1]")
    _check_schedule(lr, weight_decay, warmup_steps)


def check_fine_tune_options(
    trainable: str = "attention",
    layers: Sequence[int] | None = None,
    lr: float = 1e-4,
    weight_decay: float = 0.0,
    warmup_steps: int = 10,
    n_layers: int | None = None,
) -> None:
    """Every option of ``FineTuneLMModule`` that can be judged before the model loads, one line naming the key
    otherwise (``n_layers``: the pretrained model's, when known, bounds ``layers``)."""
    check_choice("model.trainable", trainable, Part)
    check_indices("model.layers", "layer", layers or (), n_layers)
    _check_schedule(lr, weight_decay, warmup_steps)
