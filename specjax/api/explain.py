"""`specjax.explain`: the numbers of a few verify steps, for reading the code next to the papers.

    steps = specjax.explain(target, "def add(a, b):", method="speculative", draft=draft,
                            k=4, temperature=1.0, seed=0, steps=3)
    print(specjax.format_steps(steps, target.tokenizer))

Each step lists the drafted tokens x_i with p_i(x_i) (the draft) and q_i(x_i) (the target), the
uniform draw u_i, whether u_i * p_i(x_i) < q_i(x_i) accepted it, the residual's top entries
after a rejection, and the token the target emitted. It runs the decoding loop's own step
function (`decoding.loop.step`) with `DecodeSpec.trace`, which makes the step keep the numbers
`rejection.verify` computes anyway: there is no second implementation, and the tokens are
those `generate` returns for the same arguments (tested).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.api.generate import GenerationError, prepare
from specjax.decoding import loop
from specjax.io.checkpoint import Model


@dataclasses.dataclass(frozen=True)
class Draft:
    token: int
    p: float             # p_i(x_i): the draft's probability of the token it drew
    q: float             # q_i(x_i): the target's
    u: float             # the uniform draw of the accept test u * p < q
    accepted: bool


@dataclasses.dataclass(frozen=True)
class Step:
    drafts: list[Draft]                  # in order; the first rejection ends the accepted run
    residual_top: list[tuple[int, float]]   # after a rejection: the residual's largest entries
    emitted: int                         # the target's token after the accepted drafts
    from_residual: bool                  # drawn from the residual (else q at the next position)
    new_tokens: list[int]                # what the step appended (fewer at EOS or the limit)


def explain(target: Model, prompt, *, steps: int = 4, top: int = 3, **kwargs) -> list[Step]:
    """The first `steps` verify steps of one prompt, decoded with `generate`'s arguments."""
    method = kwargs.get("method", "autoregressive")
    if method not in ("speculative", "ngram") or kwargs.get("tree") is not None:
        raise GenerationError("explain shows chain verification: method 'speculative' or "
                              f"'ngram' without a tree, not {method!r}"
                              + (" with a tree" if kwargs.get("tree") is not None else ""))
    for name, value in (("steps", steps), ("top", top)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GenerationError(f"{name} must be an integer >= 1, got {value!r}")
    request = prepare(target, [prompt], **kwargs)
    spec = dataclasses.replace(request.spec, trace=True)
    state = loop.init(spec, request.weights, *request.inputs)
    out = []
    while len(out) < steps and not bool(np.asarray(state.done)[0]):
        before = int(state.length[0])
        state = loop.step(spec, request.weights, state)
        trace = {name: np.asarray(value)[0] for name, value in state.trace.items()}
        n = int(trace["accepted"])
        drafts = [Draft(int(trace["tokens"][i]), float(trace["p_x"][i]), float(trace["q_x"][i]),
                        float(trace["u"][i]), i < n)
                  for i in range(min(int(trace["drafted"]), n + 1))]
        from_residual = n < int(trace["drafted"])
        order = np.argsort(-trace["residual"])[:top] if from_residual else []
        out.append(Step(drafts, [(int(t), float(trace["residual"][t])) for t in order],
                        int(trace["emitted"]), from_residual,
                        np.asarray(state.tokens)[0, before:int(state.length[0])].tolist()))
    return out


def format_steps(steps: list[Step], tokenizer=None) -> str:
    """The steps as text: one block per step, one line per drafted token."""
    def show(token: int) -> str:
        return repr(tokenizer.decode([token])) if tokenizer is not None else str(token)

    lines = []
    for i, step in enumerate(steps, 1):
        lines.append(f"step {i}: {len(step.drafts)} draft token(s) examined")
        for d in step.drafts:
            verdict = "accept" if d.accepted else "reject"
            lines.append(f"  x = {show(d.token):<14} p = {d.p:.4f}  q = {d.q:.4f}  u = {d.u:.4f}"
                         f"  u*p = {d.u * d.p:.4f} {'<' if d.accepted else '>='} q  -> {verdict}")
        if step.from_residual:
            top = ", ".join(f"{show(t)} {p:.4f}" for t, p in step.residual_top)
            lines.append(f"  residual normalize(max(q - p, 0)), top: {top}")
            lines.append(f"  emitted {show(step.emitted)} from the residual")
        else:
            lines.append(f"  emitted {show(step.emitted)} from q at the next position")
        lines.append(f"  new tokens: {' '.join(show(t) for t in step.new_tokens)}")
    return "\n".join(lines)
