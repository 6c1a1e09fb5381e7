"""Run by tests/test_text.py in a subprocess: a 2-process CPU DDP ``trainer.test`` over the text and
task DataModules. Each rank writes the item indices it saw; rank 0 writes the DDP-synced metric.

Usage: python tests/ddp_data_script.py OUT_DIR TOKENIZER_DIR TEXT_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lit_svd.cli import end_process_group  # noqa: E402
from lit_svd.datamodules.tasks import TaskDataModule  # noqa: E402
from lit_svd.datamodules.text import TextDataModule  # noqa: E402
from lit_svd.metrics import LogitDifference  # noqa: E402
from tests.helpers import quiet_trainer  # noqa: E402


class Recorder(pl.LightningModule):
    """No model: records batch indices; scores a fixed fake logit table so the synced mean is checkable."""

    def __init__(self, out: Path, name: str, vocab: int):
        super().__init__()
        self.out, self.name = out, name
        self.table = torch.linspace(-3, 3, vocab)  # logit of token t, the same for every example
        self.metric = LogitDifference()
        self.seen: list[int] = []

    def test_step(self, batch, batch_idx):
        self.seen += batch["index"].tolist()
        if "correct_id" in batch:
            logits = self.table.expand(len(batch["index"]), -1)
            self.metric.update(logits, batch)

    def on_test_epoch_end(self):
        (self.out / f"{self.name}_rank{self.global_rank}.json").write_text(json.dumps(self.seen))
        if self.name == "ioi":
            value = float(self.metric.compute())  # synced over both ranks
            if self.global_rank == 0:
                (self.out / "ioi_metric.json").write_text(json.dumps(value))


def main(out: str, tokenizer_dir: str, text_file: str) -> None:
    from transformers import AutoTokenizer

    out_dir = Path(out)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    modules = {
        "text": TextDataModule(tok, path=text_file, seq_len=16, n_tokens=0, test_tokens=16 * 10 + 5, batch_size=3),
        "ioi": TaskDataModule("ioi", tok, n_train=4, n_val=4, n_test=23, batch_size=4),
    }
    for name, dm in modules.items():
        trainer = quiet_trainer(2, out_dir / "runs")
        trainer.test(Recorder(out_dir, name, len(tok)), datamodule=dm)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    finally:
        end_process_group()  # before exit: a live gloo group can abort a finished run
