"""One model, loaded once: the model object every method runs on.

``ModelOptions`` is the one group of loading options (model, gguf_file, revision, dtype, device_map,
offload_folder, fold_norms), validated in one place (``check``); ``LoadedModel`` holds what they load: the HF
model, its tokenizer, its view (one per ``fold_norms``) and, through the view, the cache of sign-fixed SVDs per
(layer, kind) that every method reads (``lit_svd.models.svds``). ``load_model(options)`` is the one place a
pretrained model is loaded for a method: every pretrained-model module builds its model through ``obtain``,
which hands it the model object in use under the same options (``using``: the Python API's ``m.sad(...)``) and
loads one otherwise (the command line). ``LoadedModel.of(hf_model_or_view)`` wraps a model loaded elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from lit_svd.choices import check_choice
from lit_svd.models.base import ModelView
from lit_svd.models.loading import IN_USE, DType, _placement, in_use, load_causal_lm, load_tokenizer, torch_dtype
from lit_svd.models.svds import SVDCache, cache_of

# What each loading option means: the one description of each (PretrainedLMModule's docstring is built from it,
# so that ``--model.help`` of every pretrained-model module shows these lines).
OPTION_HELP: dict[str, str] = {
    "model": "offline alias (``smollm2-135m``, ``gemma3-270m``), hub name, local folder, ``.gguf`` file,"
    " ``arch:NAME`` (random weights of a named architecture) or ``tiny-<arch>`` (a tiny random model).",
    "gguf_file": "the GGUF file inside ``model`` when ``model`` is a folder.",
    "revision": "hub revision (e.g. a Pythia training checkpoint such as ``step1000``).",
    "dtype": "what the frozen model runs in (float32, bfloat16, float16; float64 for exact checks). The analysis"
    " maths (weights read through the view, SVDs, sums, nulls, statistics, trained masks) stays in float32"
    " (float64 for a float64 model).",
    "device_map": "place the model with accelerate (``{module name: device, 'cpu' or 'disk'}`` or 'auto'); modules"
    " mapped to 'disk' are offloaded to ``offload_folder`` and loaded layer by layer in each forward"
    " (``lit_svd.models.loading.layer_offload_map`` writes such a map). Lightning does not move a placed model.",
    "offload_folder": "where disk-offloaded weights are written.",
    "fold_norms": "fold the norms' weights into the view's matrices.",
}


@dataclass(frozen=True)
class ModelOptions:
    """The loading options of a pretrained model (``OPTION_HELP`` says what each means)."""

    model: str = "smollm2-135m"
    gguf_file: str | None = None
    revision: str | None = None
    dtype: DType = "float32"
    device_map: str | dict[str, int | str] | None = None
    offload_folder: str | None = None
    fold_norms: bool = True

    def check(self) -> ModelOptions:
        """Each option's type and value, and their combinations, in one line naming the key; returns self."""
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model.model={self.model!r}: give a model name, folder or .gguf file")
        for key in ("gguf_file", "revision", "offload_folder"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"model.{key}={value!r}: give a string or null")
        torch_dtype(self.dtype, "model.dtype")
        if not isinstance(self.fold_norms, bool):
            raise ValueError(f"model.fold_norms={self.fold_norms!r}: give true or false")
        if self.device_map is not None and not isinstance(self.device_map, (str, dict)):
            raise ValueError(f"model.device_map={self.device_map!r}: give 'auto', a {{module: device}} map or null")
        if self.device_map is not None and self.model.startswith("arch:"):
            raise ValueError(
                f"device_map with model={self.model!r}: a random-weight arch model has no weights on disk to place;"
                " load a saved model (a local folder) to use a device map"
            )
        _placement(self.device_map, self.offload_folder)
        return self

    def same_weights(self, other: ModelOptions) -> bool:
        """Whether both load the same model in the same way (``fold_norms`` only changes the view)."""
        return replace(self, fold_norms=True) == replace(other, fold_norms=True)

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        default = ModelOptions()
        mine = self.as_dict()
        return {k: v for k, v in mine.items() if v != getattr(default, k)}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LoadedModel:
    """A pretrained model loaded once: ``lm`` (the HF model, frozen), ``tokenizer``, ``options``, ``view()`` (the
    architecture view; one per ``fold_norms``) and ``svds`` (the view's cache of sign-fixed SVDs per (layer, kind))."""

    def __init__(
        self, lm: nn.Module, tokenizer: Any, options: ModelOptions, views: dict[bool, ModelView] | None = None
    ):
        self.lm, self.tokenizer, self.options = lm, tokenizer, options
        self._views: dict[bool, ModelView] = dict(views or {})

    @classmethod
    def load(cls, options: ModelOptions) -> LoadedModel:
        """Load the model the options name (``load_causal_lm``), frozen."""
        options.check()
        lm, tokenizer = load_causal_lm(
            options.model,
            gguf_file=options.gguf_file,
            revision=options.revision,
            dtype=torch_dtype(options.dtype, "dtype"),
            device_map=options.device_map,
            offload_folder=options.offload_folder,
        )
        for p in lm.parameters():
            p.requires_grad_(False)
        return cls(lm, tokenizer, options)

    @classmethod
    def of(cls, model: nn.Module | ModelView, tokenizer: Any = None, name: str | None = None) -> LoadedModel:
        """A model loaded elsewhere (an HF causal LM, or a view of one) as a model object: ``name`` (default: the
        model's ``name_or_path``) stands for it while it is in use; ``tokenizer`` (default: the one ``name`` loads)."""
        view = model if isinstance(model, ModelView) else None
        lm: Any = view.model if view is not None else model
        if not hasattr(lm, "config") or not callable(getattr(lm, "forward", None)):
            raise ValueError(f"model: a Hugging Face causal LM or a lit_svd view of one, not {type(model).__name__}")
        name = name or getattr(lm, "name_or_path", "") or type(lm).__name__
        dtype = next(lm.parameters()).dtype
        options = ModelOptions(model=name, dtype=_dtype_name(dtype), fold_norms=view.fold_norms if view else True)
        if tokenizer is None:
            tokenizer = load_tokenizer(name)
        lm.eval()
        for p in lm.parameters():
            p.requires_grad_(False)
        return cls(lm, tokenizer, options.check(), {view.fold_norms: view} if view is not None else None)

    @property
    def name(self) -> str:
        return self.options.model

    def view(self, fold_norms: bool | None = None) -> ModelView:
        """The architecture view (``fold_norms``: None, the options' own), made once per ``fold_norms``."""
        from lit_svd.models import view

        fold = self.options.fold_norms if fold_norms is None else fold_norms
        if fold not in self._views:
            self._views[fold] = view(self.lm, fold_norms=fold)
        return self._views[fold]

    @property
    def svds(self) -> SVDCache:
        """The cache of sign-fixed SVDs per (layer, kind) of ``view()`` (``lit_svd.models.svds``)."""
        return cache_of(self.view())

    def __repr__(self) -> str:
        v = self.view()
        placed = getattr(self.lm, "hf_device_map", None)
        device = f"device map ({len(set(map(str, placed.values())))} places)" if placed else str(_device(self.lm))
        kinds = sorted({k for cached in (cache_of(x) for x in self._views.values()) for _, k in cached.entries})
        n = sum(len(cache_of(x)) for x in self._views.values())
        mib = sum(cache_of(x).nbytes for x in self._views.values()) / 2**20
        return "\n".join(
            [
                f"{type(self).__name__}({self.name!r})",
                f"  family {v.model_type}: {v.n_layers} layers, {v.n_heads} heads ({v.n_kv_heads} KV) of {v.d_head},"
                f" d_model {v.d_model}, d_mlp {v.d_mlp}",
                f"  dtype {self.options.dtype}, {device}, norms {'folded' if self.options.fold_norms else 'unfolded'}",
                f"  cached SVDs: {n} maps ({', '.join(kinds) or 'none yet'}), {mib:.1f} MiB",
            ]
        )


def _dtype_name(dtype: torch.dtype) -> DType:
    return check_choice("dtype", str(dtype).removeprefix("torch."), DType)


def _device(lm: nn.Module) -> torch.device:
    return next(lm.parameters()).device


def load_model(options: ModelOptions) -> LoadedModel:
    """The one place a pretrained model is loaded for a method (``LoadedModel.load``)."""
    return LoadedModel.load(options)


def obtain(options: ModelOptions, share: bool = True) -> LoadedModel:
    """The model object of ``options``: the newest one in use under the same name and loading options (``share``:
    a module that never changes the weights), else a new one (``load_model``). A model object in use under the name
    with other loading options fails in one line (it would silently be a second model in memory)."""
    options.check()
    found = in_use(options.model) if share else None
    if found is None:
        return load_model(options)
    if not found.options.same_weights(options):
        theirs, ours = found.options.changed(), options.changed()
        raise ValueError(
            f"model={options.model!r} is the model object in use, loaded with {theirs or 'the default options'};"
            f" this run asks for {ours or 'the default options'}: load another model object for those"
        )
    return found


@contextmanager
def using(model: LoadedModel) -> Iterator[LoadedModel]:
    """Within the block, ``model.name`` stands for ``model``: modules, data modules and checks take it instead of
    loading the name (``obtain``, ``loading.load_tokenizer``, ``loading.load_config``)."""
    IN_USE.append(model)
    try:
        yield model
    finally:
        IN_USE.remove(model)
