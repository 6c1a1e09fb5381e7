"""Observers that compute an analysis during or after a run and write it out."""

from lit_svd.callbacks.alignment import SVDAlignmentCallback
from lit_svd.callbacks.masks import DirectionMaskReport
from lit_svd.callbacks.mounts import MountsReport
from lit_svd.callbacks.mounts_training import MountsCallback
from lit_svd.callbacks.sad import SADCallback
from lit_svd.callbacks.spectrum import SpectrumCallback

__all__ = [
    "DirectionMaskReport",
    "MountsCallback",
    "MountsReport",
    "SADCallback",
    "SVDAlignmentCallback",
    "SpectrumCallback",
]
