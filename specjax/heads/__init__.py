"""Drafters that live on the target itself: the math of Medusa heads (`medusa`), EAGLE
drafters (`eagle`) and DFlash block drafters (`dflash`), and what they share (`shared`: the
subset projection, the target's identity).

Parameters, initialisation and the forward passes on the target's states. Files (saving,
loading, the check that a drafter meets its target) live in `specjax.io.medusa`,
`specjax.io.eagle` and `specjax.io.sidecar`.

Layer: may import `specjax.model` and `specjax.sampling` (a heads checkpoint names the tree
it was tuned for); imported by decoding, io and the API.
"""

from specjax.heads.medusa import Heads, HeadsConfig, init_heads, runtime_weights

__all__ = ["Heads", "HeadsConfig", "init_heads", "runtime_weights"]
