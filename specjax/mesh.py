"""Running on a device mesh: tensor parallelism over "model", data parallelism over "data".

    mesh = specjax.mesh.make_mesh(data=2, model=4)            # 8 devices
    target = specjax.load("weights/llama-target", mesh=mesh)
    result = specjax.generate(target, prompts, method="speculative", draft=draft, mesh=mesh)

A mesh is a `jax.sharding.Mesh` with two axes, "data" and "model". Nothing in the forward pass
knows about it: every parameter's splittable axis is named once (`model.PARAM_AXES`), this
module maps those names to the "model" axis, and the decoding programs are jitted with the
resulting input and output shardings; XLA's SPMD partitioner writes the communication.

What goes where:
- the target's weights, Megatron style: query heads (wq, wo) and key/value heads (wk, wv) split
  over "model", the MLP width F split (w_in/w_gate/w_up by rows, w_out/w_down by columns), the
  vocabulary split for the embedding and LM head, norms and output biases replicated. A layer
  then needs one sum over "model" after attention and one after the MLP.
- the KV cache [B, K, ...] split over "data" by row and over "model" by key/value head.
- the token buffer, lengths, keys and every per-row counter split over "data".
- the draft (and Medusa heads) replicated: a small model's weights are cheap to hold on every
  device, and splitting them would add two sums per draft layer to every drafted token.
  `generate(..., shard_draft=True)` splits the draft like the target instead.

A logical axis the "model" axis does not divide is replicated, and `plan` says so: SmolLM2-135M
has 9 query heads and 3 key/value heads, so on model=2 or 4 its attention weights and cache are
replicated while its MLP and vocabulary are split (on model=3 everything is split). Key/value
heads are split only when the query heads are too, and a cache is split exactly when its
model's key/value heads are (GQA and MQA with fewer key/value heads than devices: replicated
over "model", each device holding every head its query heads read). A batch whose row count
"data" does not divide is padded with copies of its last row, which are dropped from the
result.

A row's random stream does not depend on the mesh: row b's key is derived from the seed and b
on the host, and JAX's partitionable Threefry draws the same numbers however an array is split.
What can differ is float rounding: a split product sums its parts on different devices and then
adds them, in another order than one device would (see the README on what the tests compare).
"""

from __future__ import annotations

import numbers

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.model.config import ModelConfig
from specjax.model.params import PARAM_AXES, logical_sizes, param_shapes

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)


class MeshError(ValueError):
    """A mesh that does not fit the devices, or is not a data x model mesh."""


def make_mesh(data: int = 1, model: int | None = None, devices=None) -> Mesh:
    """A `data` x `model` mesh over the first data * model of `devices` (default: all of
    `jax.devices()`); `model` defaults to the devices left after `data`. `jax.make_mesh` orders
    the devices by the accelerators' topology, so that "model" neighbours share the fastest
    links; both axes are of JAX's automatic kind (`check_mesh`)."""
    devices = list(jax.devices() if devices is None else devices)
    for name, value in (("data", data), ("model", model)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                  or value < 1):
            raise MeshError(f"mesh axis {name} must be an integer >= 1, got {value!r}")
    if model is None:
        model = max(1, len(devices) // data)
    if data * model > len(devices):
        hint = (" (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count="
                f"{data * model} before JAX starts)") if devices[0].platform == "cpu" else ""
        raise MeshError(f"a mesh of data={data} x model={model} needs {data * model} devices; "
                        f"{len(devices)} available{hint}")
    return jax.make_mesh((data, model), AXES, axis_types=(AxisType.Auto,) * 2,
                         devices=devices[:data * model])


def check_mesh(mesh) -> None:
    """A mesh specjax runs on: axes "data" and "model", both `AxisType.Auto` (the partitioner
    places the communication; an Explicit axis makes every op state its output sharding, which
    the model code does not, and `jax.make_mesh` makes Explicit axes unless told otherwise)."""
    if not isinstance(mesh, Mesh) or tuple(mesh.axis_names) != AXES:
        names = tuple(mesh.axis_names) if isinstance(mesh, Mesh) else type(mesh).__name__
        raise MeshError(f"mesh must be a jax.sharding.Mesh with axes ('data', 'model') "
                        f"(specjax.mesh.make_mesh), got {names}")
    kinds = tuple(getattr(mesh, "axis_types", (AxisType.Auto,) * 2))
    if any(kind != AxisType.Auto for kind in kinds):
        raise MeshError(f"mesh axes must be of type AxisType.Auto, got "
                        f"{tuple(str(k) for k in kinds)}: use specjax.mesh.make_mesh, or pass "
                        "axis_types=(AxisType.Auto,) * 2 to jax.make_mesh")


def split_axes(config: ModelConfig, mesh: Mesh) -> dict[str, bool]:
    """Which logical axes of `model.PARAM_AXES` this mesh splits: those its "model" axis divides
    (key/value heads only with the query heads). The rest are replicated."""
    m = mesh.shape[MODEL]
    sizes = logical_sizes(config)
    split = {name: size % m == 0 for name, size in sizes.items()}
    split["kv_heads"] = split["kv_heads"] and split["heads"]
    return split


def plan(config: ModelConfig, mesh: Mesh, shard: bool = True) -> str:
    """How each logical axis is laid out on this mesh, one "; "-separated entry per axis (for
    the CLI and bench)."""
    m = mesh.shape[MODEL]
    split = split_axes(config, mesh) if shard else dict.fromkeys(logical_sizes(config), False)
    lines = []
    for name, size in logical_sizes(config).items():
        if m == 1:
            how = "one device holds all"
        elif split[name]:
            how = f"split over model={m}: {size // m} per device"
        elif not shard:
            how = "replicated"
        else:
            how = f"replicated ({size} is not a multiple of {m})"
        lines.append(f"{name} ({size}): {how}")
    return "; ".join(lines)


def param_specs(config: ModelConfig, mesh: Mesh, shard: bool = True) -> dict:
    """A PartitionSpec per parameter, in `param_shapes`'s tree."""
    split = split_axes(config, mesh) if shard else {}

    def spec(path, shape):
        stacked = path[0].key == "layers"        # a leading L axis, never split
        axes = PARAM_AXES.get(path[-1].key, (None,) * (len(shape) - stacked))
        return P(*((None,) * stacked), *(MODEL if split.get(a) else None for a in axes))

    return jax.tree.map_with_path(spec, param_shapes(config),
                                  is_leaf=lambda s: isinstance(s, tuple))


def param_shardings(config: ModelConfig, mesh: Mesh, shard: bool = True) -> dict:
    """A NamedSharding per parameter (`param_specs`), for `jax.device_put` and `jit`."""
    return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(config, mesh, shard),
                        is_leaf=lambda s: isinstance(s, P))


def cache_sharding(config: ModelConfig, mesh: Mesh, shard: bool = True) -> NamedSharding:
    """Of the cache's stacked buffers (keys [L, B, K, H, S], values [L, B, K, S, H]): rows over
    "data", key/value heads over "model" when the weights split them."""
    heads = MODEL if shard and split_axes(config, mesh)["kv_heads"] else None
    return NamedSharding(mesh, P(None, DATA, heads))


def rows(mesh: Mesh) -> NamedSharding:
    """Of any per-row array [B, ...]: rows over "data", the rest replicated."""
    return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def padded_rows(batch: int, mesh: Mesh) -> int:
    """The batch padded up to a multiple of the "data" axis."""
    d = mesh.shape[DATA]
    return -(-batch // d) * d


def place(array: np.ndarray, sharding: NamedSharding, dtype) -> jax.Array:
    """A host array put on the mesh shard by shard: each device receives its own slice (cast to
    `dtype` on the host), and no device ever holds the whole array unless its sharding says
    so."""
    return jax.make_array_from_callback(array.shape, sharding,
                                        lambda index: np.asarray(array[index], dtype))


def put(tree, shardings):
    """`tree` laid out as `shardings` (a tree of NamedShardings, or a prefix of one) says: arrays
    already placed so are kept as they are, the others copied from the host shard by shard
    (`place`), which also works when the mesh spans several processes."""
    def put_subtree(sharding, subtree):
        def one(a):
            if isinstance(a, jax.Array) and a.sharding.is_equivalent_to(sharding, a.ndim):
                return a
            return place(np.asarray(a), sharding, a.dtype)
        return jax.tree.map(one, subtree)

    return jax.tree.map(put_subtree, shardings, tree,
                        is_leaf=lambda x: isinstance(x, NamedSharding))


def shard_params(params: dict, config: ModelConfig, mesh: Mesh, shard: bool = True) -> dict:
    """`params` moved onto the mesh (`put`: parameters already placed so stay)."""
    return put(params, param_shardings(config, mesh, shard))


def bytes_per_device(params: dict) -> int:
    """The largest number of parameter bytes any one device holds."""
    held: dict = {}
    for a in jax.tree.leaves(params):
        for s in a.addressable_shards:
            held[s.device] = held.get(s.device, 0) + s.data.nbytes
    return max(held.values(), default=0)


def shard_shape(array: jax.Array) -> tuple[int, ...]:
    """The shape of one device's piece of `array`."""
    return array.sharding.shard_shape(array.shape)

