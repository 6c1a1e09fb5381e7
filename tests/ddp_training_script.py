"""Run by tests/test_training_callbacks.py in a subprocess: a tiny LM ``fit`` on 1 or 2 CPU processes (DDP)
with the SAD, mounts and spectrum callbacks; rank 0 writes their values per step, and the mount and spectrum
values of the final weights recomputed in this one process on the whole probe.

Usage: python tests/ddp_training_script.py OUT_DIR DEVICES WIKITEXT_VALID
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lit_svd.analysis import mounts as M  # noqa: E402
from lit_svd.analysis.spectrum import spectrum_rows  # noqa: E402
from lit_svd.callbacks.mounts_training import MountsCallback  # noqa: E402
from lit_svd.callbacks.sad import SADCallback  # noqa: E402
from lit_svd.callbacks.spectrum import SpectrumCallback  # noqa: E402
from lit_svd.cli import end_process_group  # noqa: E402
from lit_svd.datamodules.text import TextDataModule  # noqa: E402
from lit_svd.models.loading import load_tokenizer  # noqa: E402
from lit_svd.modules.language_model import LanguageModelModule  # noqa: E402
from lit_svd.modules.mounts_training import score_site_layers  # noqa: E402
from tests.helpers import quiet_trainer  # noqa: E402


def mount_values(rows):
    return [
        v
        for r in rows
        for v in (
            [r[f"lift_{s}"] for s in M.STRATEGIES]
            + r["coverage_lift"]
            + r["tile_lift"]
            + [r["identity_rel_err"], float(r["n_tokens"])]
        )
    ]


def spectrum_values(rows):
    return [v for r in rows for v in (r["S"] + [r["effective_rank"], r["top_k_energy"]])]


def main(out: str, devices: int, valid: str) -> None:
    out_dir = Path(out)
    probe = str(Path(valid).with_name("test.txt"))
    tok = load_tokenizer("smollm2-135m")
    dm = TextDataModule(tok, path=valid, seq_len=16, n_tokens=16 * 16, batch_size=2)
    pl.seed_everything(0)
    module = LanguageModelModule(
        n_layers=2, d_model=32, n_heads=4, max_positions=32, vocab_top_k=256, warmup_steps=1, lr=3e-3
    )
    kw = dict(
        sites=["o", "down"], tile_widths={"o": 8, "down": 32}, modes_per_tile=2, modes_sweep=[1, 2, 4], k_active=4
    )
    cbs = [
        SADCallback(every_n_steps=2, n_probe=5, probe_path=probe, probe_seq_len=16, log_spaced=False),
        MountsCallback(probe, every_n_steps=2, probe_windows=5, probe_seq_len=16, figures=False, **kw),
        SpectrumCallback(every_n_steps=2, figures=False),
    ]
    trainer = quiet_trainer(devices, out_dir / "run", max_steps=2, callbacks=cbs, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    if not trainer.is_global_zero:
        return
    sad, mounts, spec = cbs
    ids, mask = mounts.probe
    keys = mounts.keys(module.view)
    again = score_site_layers(
        module.view, module.lm, ids, mask, keys, mounts.widths(module.view), 2, [1, 2, 4], 4, 0, M.MountRules()
    )
    values = {
        "mounts": [{"step": h["step"], "values": mount_values(h["rows"])} for h in mounts.history],
        "spectrum": [{"step": h["step"], "values": spectrum_values(h["rows"])} for h in spec.history],
        "sad": [{"step": h["step"], "values": h["sparsity"] + h["sparsity_rotated"]} for h in sad.history],
        "recomputed": {
            "mounts": mount_values(again),
            "spectrum": spectrum_values(spectrum_rows(module.view, [0, 1], 4)),
        },
    }
    (out_dir / "values.json").write_text(json.dumps(values))


if __name__ == "__main__":
    try:
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    finally:
        end_process_group()  # before exit: a live gloo group can abort a finished run
