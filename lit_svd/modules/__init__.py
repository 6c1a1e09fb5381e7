"""LightningModules: what is trained or evaluated."""

from lit_svd.modules.direction_mask import DirectionMaskModule
from lit_svd.modules.language_model import FineTuneLMModule, LanguageModelModule
from lit_svd.modules.mounts import MountsAnalysisModule
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.modules.sad import SADAnalysisModule
from lit_svd.modules.toy import ToyAlignmentModule

__all__ = [
    "DirectionMaskModule",
    "FineTuneLMModule",
    "LanguageModelModule",
    "MountsAnalysisModule",
    "PretrainedLMModule",
    "SADAnalysisModule",
    "ToyAlignmentModule",
]
