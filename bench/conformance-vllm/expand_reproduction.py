"""vLLM on the CPU verifies drafts with sampling controls it never wrote: a minimal reproduction of
vLLM #55005 (docs/conformance.md, "A real client: vLLM"). Run it with vLLM's own Python:

    $SPECJAX_VLLM_PYTHON -I bench/conformance-vllm/expand_reproduction.py

It registers vLLM's CPU fallbacks for its Triton kernels as an engine on the CPU does, then asks
`expand_batch_to_tokens`, the function whose output the rejection sampler divides the drafts'
target logits by (and masks them with), to expand two requests' temperature, top-p and top-k over
their 2 and 3 draft positions: as shipped, and with the fallback `_expand_kernel_impl` replaced
by `fixed_expand` (specjax/testing/vllm_worker.py), which writes its output in place. The
expected output is each request's value repeated over its positions (a temperature of 0, greedy,
read as 1).

The cause. `_expand_kernel_impl` (vllm/utils/cpu_triton_utils.py) hands the C++ kernel
`_ensure_int64(output)`: for a float32 or int32 `output` that is a new int64 tensor, which the
kernel fills and nobody reads, while `output`, made by `new_empty`, keeps whatever the memory
held. The fix: expand into `output` itself, in its own dtype.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.utils import cpu_triton_utils
from vllm.v1.sample import rejection_sampler

WORKER = Path(__file__).resolve().parents[2] / "specjax" / "testing" / "vllm_worker.py"
CU_NUM_DRAFT_TOKENS = torch.tensor([2, 5], dtype=torch.int32)     # 2 drafts, then 3
CONTROLS = {   # name: (the two requests' values, replace_from, replace_to) as the sampler asks
    "temperature": (torch.tensor([0.7, 0.0], dtype=torch.float32), 0, 1),
    "top_p": (torch.tensor([0.9, 1.0], dtype=torch.float32), 0, 0),
    "top_k": (torch.tensor([4, 6], dtype=torch.int32), 0, 0),
}


def expanded() -> dict[str, list]:
    """Each control expanded over the draft positions, as the rejection sampler expands it."""
    return {name: rejection_sampler.expand_batch_to_tokens(
                values, CU_NUM_DRAFT_TOKENS, 5, replace_from=start, replace_to=end).tolist()
            for name, (values, start, end) in CONTROLS.items()}


def main() -> None:
    spec = importlib.util.spec_from_file_location("vllm_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    print("expected:", {name: [values.tolist()[0]] * 2 + [values.tolist()[1]] * 3
                        for name, (values, *_rest) in CONTROLS.items()}
          | {"temperature": [0.7] * 2 + [1.0] * 3})
    CpuPlatform.register_triton_kernel_overrides()            # what a CPU engine does
    print("as shipped:", expanded())
    cpu_triton_utils._expand_kernel_impl = worker.fixed_expand
    CpuPlatform.register_triton_kernel_overrides()
    print("fixed:", expanded())


if __name__ == "__main__":
    main()
