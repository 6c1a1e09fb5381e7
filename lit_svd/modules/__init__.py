"""LightningModules: what is trained or evaluated."""
from lit_svd.modules.toy import ToyAlignmentModule  # noqa: E402,F401
from lit_svd.modules.direction_mask import DirectionMaskModule  # noqa: E402,F401
from lit_svd.modules.mounts import MountsAnalysisModule  # noqa: E402,F401
from lit_svd.modules.sad import SADAnalysisModule  # noqa: E402,F401
from lit_svd.modules.language_model import LanguageModelModule  # noqa: E402,F401
