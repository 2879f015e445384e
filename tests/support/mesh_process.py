"""One of two processes of a mesh that spans processes (`jax.distributed`), run by
tests/engine/test_mesh.py: 4 forced host devices each, one 2 x 4 mesh over the 8, the target loaded
onto it with `load(mesh=)`, the draft placed by `generate`. Prints each method's tokens as one
JSON line; both processes must print what one device gives.

    python tests/support/mesh_process.py PROCESS_ID PORT PROMPTS_JSON
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import jax  # noqa: E402

process_id, port, prompts = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)

import specjax  # noqa: E402
from specjax.presets import WEIGHTS  # noqa: E402
import specjax
from specjax.mesh import make_mesh

assert len(jax.devices()) == 8 and len(jax.local_devices()) == 4
mesh = make_mesh(data=2, model=4)
target = specjax.load(WEIGHTS / "llama-target", mesh=mesh)
draft = specjax.load(WEIGHTS / "llama-draft")
tokens = {method: specjax.generate(target, prompts,
                                   method=specjax.api.methods.build_shared(method, draft=draft, k=3),
                                   sampling=specjax.SamplingParams(temperature=1.0),
                                   max_new_tokens=8, seed=5, mesh=mesh).tokens
          for method in ("autoregressive", "speculative")}
print(json.dumps(tokens), flush=True)
jax.distributed.shutdown()
