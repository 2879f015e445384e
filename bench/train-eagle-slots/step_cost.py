"""The cost of one `train eagle --style specjax --subset 8192` step on SmolLM2, by XLA's own
count: the compiled step's FLOPs (`cost_analysis`) and its time on this host, for a batch of
ROWS x WIDTH positions (the values do not matter to either, so they are random).

    .venv/bin/python bench/train-eagle-slots/step_cost.py 16 256      # 4,096 positions

It prints the host's rate on one plain float32 product of the step's biggest shape (the
positions by the subset head), then the target's soft labels alone, the loss's forward pass,
and the whole optimizer step (the product's `_loss` and optimizer, two passes, noise on). Run
it alone on the host."""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.heads import eagle
from specjax.heads.shared import projection
from specjax.train.eagle3 import TrainConfig, _loss
from specjax.train.state import optimizer

TARGET = "/tmp/sjcache/smollm2-135m-instruct"


def timed(name, fn, *args, repeats=3):
    compiled = fn.lower(*args).compile()
    cost = compiled.cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost).get("flops", 0.0)
    jax.block_until_ready(compiled(*args))                        # the first call, untimed
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(compiled(*args))
    seconds = (time.perf_counter() - start) / repeats
    print(f"{name}: {seconds:.3f} s, {flops / 1e9:.1f} GFLOP, {flops / seconds / 1e9:.1f} GFLOP/s",
          flush=True)


def main(rows: int, width: int) -> None:
    target = specjax.load(TARGET)
    config = TrainConfig(kind="eagle1", style="specjax", subset=8192, unroll=2, noise=0.1)
    ids = np.arange(config.subset, dtype=np.int32)     # which ids does not change the cost
    start = eagle.init_drafter(target, token_ids=ids, kind="eagle1", head="subset",
                               style="specjax", seed=0, std=0.02)
    dc, trainable = start.config, start.params
    frozen = {"embed": target.params["embed"], "head": projection(target, ids)}
    rng = np.random.default_rng(0)
    final = rng.standard_normal((rows, width, dc.hidden_size)).astype(np.float32)
    batch = {"tokens": rng.integers(0, target.config.vocab_size, (rows, width)).astype(np.int32),
             "mask": np.ones((rows, width), np.float32), "tapped": final, "final": final,
             "noise": rng.uniform(-0.1, 0.1, final.shape).astype(np.float32)}
    opt = optimizer(config)

    def loss(trainable, frozen, batch):
        return _loss(trainable, frozen, batch, dc, config.unroll, config.decay)

    @jax.jit
    def step(trainable, opt_state, batch, frozen):
        (_, parts), grads = jax.value_and_grad(loss, has_aux=True)(trainable, frozen, batch)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return jax.tree.map(jnp.add, trainable, updates), opt_state, parts

    soft = jax.jit(lambda f, h: jax.nn.softmax(jnp.einsum("BTD,SD->BTS", f, h), axis=-1))
    print(f"{rows} x {width} positions; {jax.devices()[0].device_kind}, jax {jax.__version__}")
    # XLA's formulations throughout: the configs here name no CPU kernels (`ModelConfig.kernels`).
    a = jnp.asarray(rng.standard_normal((rows * width, dc.hidden_size)), jnp.float32)
    timed("matmul [positions, 576] x [576, 8192]", jax.jit(jnp.dot), a, frozen["head"].T)
    timed("soft labels", soft, final, frozen["head"])
    timed("loss, forward", jax.jit(lambda t, f, b: loss(t, f, b)[0]), trainable, frozen, batch)
    timed("optimizer step", step, trainable, opt.init(trainable), batch, frozen)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
