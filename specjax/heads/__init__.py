"""Drafters that live on the target itself: the math of Medusa heads (`medusa`).

Parameters, initialisation and the heads' forward pass on the target's hidden state. Files
(saving, loading, the check that heads meet their target) live in `specjax.io.heads`.

Layer: may import `specjax.model` and `specjax.sampling` (a heads checkpoint names the tree
it was tuned for); imported by decoding, io and the API.
"""

from specjax.heads.medusa import Heads, HeadsConfig, init_heads, runtime_weights

__all__ = ["Heads", "HeadsConfig", "init_heads", "runtime_weights"]
