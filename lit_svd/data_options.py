"""The data modules' options and their checks, without torch: each data module's constructor and the command line's
fast check (``config_check``, before torch or Lightning is imported) run the same ``check_<data>_options``.

What needs the tokenizer or the text (a task's prompt space, single-token words, a text long enough for the
windows asked for, a text file with text in it) is checked by the constructor once those are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lit_svd.option_checks import positive_int

TASK_NAMES = ("ioi", "gp", "gt")
TASK_ALIASES = {"gender_pronoun": "gp", "greater_than": "gt"}


def canonical_task(task: str) -> str:
    """ "ioi" / "gp" / "gt" for a task name or alias; one-line error otherwise."""
    key = TASK_ALIASES.get(task, task)
    if key not in TASK_NAMES:
        raise ValueError(f"task={task!r} is unknown; choose one of {', '.join([*TASK_NAMES, *TASK_ALIASES])}")
    return key


def check_task_data_options(
    task: str = "ioi", n_train: int = 1000, n_val: int = 256, n_test: int = 256, batch_size: int = 64
) -> None:
    """``TaskDataModule``'s counts (>= 0; ``batch_size`` >= 1) and its task name."""
    for key, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test), ("batch_size", batch_size)):
        if value < 0 or (key == "batch_size" and value < 1):
            raise ValueError(
                f"{key}={value} is invalid; give a {'positive' if key == 'batch_size' else 'non-negative'} integer"
            )
    canonical_task(task)


def check_text_data_options(
    path: str | None = None,
    seq_len: int = 128,
    n_tokens: int = 16384,
    val_tokens: int = 0,
    test_tokens: int = 0,
    batch_size: int = 8,
) -> None:
    """``TextDataModule``'s sizes (``seq_len``, ``batch_size`` >= 1; token counts >= 0, not all 0) and its local
    ``path``, which must exist."""
    for key, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{key}={value} is invalid; give a positive integer")
    for key, value in (("n_tokens", n_tokens), ("val_tokens", val_tokens), ("test_tokens", test_tokens)):
        if value < 0:
            raise ValueError(f"{key}={value} is invalid; give an integer >= 0")
    if n_tokens + val_tokens + test_tokens == 0:
        raise ValueError("n_tokens, val_tokens and test_tokens are all 0; give at least one split tokens")
    if path is not None:
        check_text_path(path)


def check_text_path(path: str) -> None:
    if not Path(path).exists():
        raise ValueError(f"path={path!r} does not exist; give a text file or a folder of .txt files")


def check_sparse_feature_options(
    n_features: int = 20,
    n_keys: int = 8,
    p: Any = 0.1,
    n_instances: int | None = None,
    batch_size: int = 1024,
    num_workers: int = 0,
) -> tuple[list[float], int]:
    """``SparseFeatureDataModule``'s options (positive sizes, probabilities in (0, 1], one per instance or one for
    all, ``num_workers`` >= 0); returns ``(the probabilities as given, n_instances)``."""
    for name, value in (("n_features", n_features), ("n_keys", n_keys), ("batch_size", batch_size)):
        positive_int(name, value)
    probs = [float(p)] if isinstance(p, (int, float)) else [float(v) for v in p]
    if isinstance(p, (list, tuple)) and n_instances not in (None, len(probs)):
        raise ValueError(f"p has {len(probs)} values but n_instances={n_instances}; give one p per instance")
    n_instances = len(probs) if n_instances is None else n_instances
    positive_int("n_instances", n_instances)
    if not probs or any(not 0.0 < v <= 1.0 for v in probs):
        raise ValueError(f"p={p!r}: every activation probability must lie in (0, 1]")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers}: must be >= 0")
    return probs, n_instances
