"""Observers that compute an analysis during or after a run and write it out."""
from lit_svd.callbacks.masks import DirectionMaskReport  # noqa: E402,F401
from lit_svd.callbacks.mounts import MountsReport  # noqa: E402,F401
from lit_svd.callbacks.sad import SADCallback  # noqa: E402,F401
from lit_svd.callbacks.alignment import SVDAlignmentCallback  # noqa: E402,F401
