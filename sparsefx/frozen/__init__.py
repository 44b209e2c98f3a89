"""Frozen inference models on sparse CPU kernels (``sparsefx.freeze``): packing, kernels, their choice."""

from .freeze import BACKENDS, FrozenModel, LayerReport, freeze

__all__ = ["freeze", "FrozenModel", "LayerReport", "BACKENDS"]
