"""attnlib: self-attention from the dot product up, in NumPy and PyTorch.

The public API, each in a file of its own:

- :func:`softmax` (``softmax.py``)
- :func:`project_qkv` (``projections.py``)
- :func:`score_matrix` (``scores.py``)
- :func:`causal_mask` (``masks.py``)
- :func:`attention_weights`, :func:`attention`, :func:`backends` (``attention.py``)
- :mod:`attnlib.mods`: FlexAttention-style ``score_mod`` / ``mask_mod`` gallery (``mods.py``);
  :func:`block_mask`, :class:`BlockMask` (``block_mask.py``)
- :func:`attention_backward`, :func:`backward_backends` (``backward.py``)
- :func:`multi_head_attention` (``multi_head.py``)
- :class:`SelfAttention` (``self_attention.py``)
- :class:`KVCache`, :func:`kv_cache_bytes` (``kv_cache.py``); generation loops in :mod:`attnlib.decoding`
- :func:`attention_with_kvcache` (``kvcache_attention.py``): batched, paged, split-KV decoding;
  :class:`PagedKVCache` (``paged.py``); :mod:`attnlib.split_kv`
- :func:`rope`, :func:`sinusoidal_positions` (``positions.py``)
- :func:`device` (``device.py``)
- :func:`unchecked`, skip the checks that read values (``validation.py``)
- :func:`varlen_attention`, :func:`varlen_attention_backward`: packed sequences (``varlen.py``)
- :mod:`attnlib.examples`, the book's running examples
"""

from . import errors, examples, mods
from .attention import attention, attention_weights, backends
from .backward import attention_backward, backward_backends
from .block_mask import BlockMask, block_mask
from .device import device
from .kv_cache import KVCache, kv_cache_bytes
from .kvcache_attention import attention_with_kvcache
from .masks import causal_mask
from .multi_head import merge_heads, multi_head_attention, split_heads
from .paged import PagedKVCache
from .positions import rope, sinusoidal_positions
from .projections import project_qkv
from .scores import score_matrix
from .self_attention import SelfAttention
from .softmax import softmax
from .validation import unchecked
from .varlen import varlen_attention, varlen_attention_backward

__version__ = "0.1.0"

__all__ = [
    "BlockMask",
    "KVCache",
    "PagedKVCache",
    "SelfAttention",
    "attention",
    "attention_backward",
    "attention_with_kvcache",
    "attention_weights",
    "backends",
    "backward_backends",
    "block_mask",
    "causal_mask",
    "device",
    "errors",
    "examples",
    "kv_cache_bytes",
    "merge_heads",
    "mods",
    "multi_head_attention",
    "project_qkv",
    "rope",
    "score_matrix",
    "sinusoidal_positions",
    "softmax",
    "split_heads",
    "unchecked",
    "varlen_attention",
    "varlen_attention_backward",
]
