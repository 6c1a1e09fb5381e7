"""LightningModules: what is trained or evaluated."""
from lit_svd.modules.mounts import MountsAnalysisModule  # noqa: E402,F401
