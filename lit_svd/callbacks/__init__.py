"""Observers that compute an analysis during or after a run and write it out."""
from lit_svd.callbacks.alignment import SVDAlignmentCallback
from lit_svd.callbacks.masks import DirectionMaskReport
from lit_svd.callbacks.mounts import MountsReport
from lit_svd.callbacks.sad import SADCallback

__all__ = ["DirectionMaskReport", "MountsReport", "SADCallback", "SVDAlignmentCallback"]
