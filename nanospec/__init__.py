"""NanoSpec: speculative decoding with a dynamic per-request draft vocabulary."""

from nanospec.config import NanoSpecConfig
from nanospec.vocab import DynamicVocab

__all__ = ["DynamicVocab", "NanoSpecConfig"]
__version__ = "0.1.0"
