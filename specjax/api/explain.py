"""`specjax.explain`: the numbers of a few verify steps, for reading the code next to the papers.

    steps = specjax.explain(target, "def add(a, b):", specjax.Speculative(draft, k=4),
                            specjax.SamplingParams(temperature=1.0), seed=0, steps=3)
    print(specjax.format_steps(steps, target.tokenizer))

A chain step (`Step`: speculative or n-gram decoding without a tree) lists the drafted tokens
x_i with p_i(x_i) (the draft) and q_i(x_i) (the target), the uniform draw u_i, whether
u_i * p_i(x_i) < q_i(x_i) accepted it, the residual's top entries after a rejection, and the
token the target emitted. A tree step (`TreeStep`: any method with a tree, Medusa, EAGLE) lists
the sibling tests of the walk in the order it made them: at each node, the children in rank
order, each with p_r(x) (the law the candidate was drawn from given its elder siblings; 1 for
deterministic candidates), q'(x) (the target's law at the node less the siblings rejected
before it), u, the verdict, and after a rejection the residual the next sibling is tested
against. It runs the decoding loop's own step function (`decoding.loop.step`) with
`DecodeSpec.trace`, which makes the step keep the numbers its rules compute anyway
(`rejection.verify` or `rejection.verify_tree`, or those of the `rules` given): there is no
second implementation, and the tokens are those `generate` returns for the same arguments,
rules included (tested).

Under the coupled rule (`coupled=True`, `sampling.coupled`) a step is a `CoupledStep`: at each
position the walk reached, the target's own draw there (its Gumbel-max draw under the position's
key), the drafts offered there (a chain's one, or the children of the node the walk stands on),
which one equals the draw and is kept, and the draw emitted where none does.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api.generate import GenerationError, prepare, says_where_options_went
from specjax.api.methods import CLASSES, Method, method_of
from specjax.decoding import loop
from specjax.model.transformer import Model
from specjax.sampling.params import SamplingParams
from specjax.sampling.rules import Rules, returns_details


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


@dataclasses.dataclass(frozen=True)
class Trial:
    """One sibling test of a tree walk: is the candidate `token` (node `node`, a child of
    `parent` at depth `depth`, rank `rank` among its siblings) accepted?"""
    depth: int
    rank: int
    node: int
    parent: int
    token: int
    p: float             # p_r(x): the law x was drawn from given its elder siblings
    q: float             # q'(x): the target's law at the parent less the siblings rejected
    u: float             # the uniform draw of the accept test u * p < q
    accepted: bool
    residual_top: list[tuple[int, float]]   # after a rejection: q' for the next sibling


@dataclasses.dataclass(frozen=True)
class TreeStep:
    nodes: list[tuple[int, int, int]]    # the tree as drafted: (node, parent, token), root excluded
    trials: list[Trial]                  # in the walk's order
    path: list[int]                      # the accepted nodes, from depth 1
    residual_top: list[tuple[int, float]]   # after a rejection: the final residual's largest
    emitted: int                         # the target's token after the accepted path
    from_residual: bool                  # drawn from the residual (else q at the last node)
    new_tokens: list[int]                # what the step appended (fewer at EOS or the limit)


@dataclasses.dataclass(frozen=True)
class Position:
    """One position of a coupled step: what the target drew there and what was drafted."""
    depth: int                           # 1 for the first position after the row's last token
    draw: int                            # the target's draw: argmax(log q + g) at this position
    drafts: list[int]                    # the tokens drafted here (none past the drafts)
    kept: bool                           # whether one of them equals the draw (and is kept)


@dataclasses.dataclass(frozen=True)
class CoupledStep:
    positions: list[Position]            # in order; the first with no draft kept ends the step
    emitted: int                         # the target's draw after the kept drafts
    new_tokens: list[int]                # what the step appended (fewer at EOS or the limit)


METHODS = tuple(cls.name for cls in CLASSES if cls.drafts)      # the listed ones that verify


def _top(distribution: np.ndarray, top: int) -> list[tuple[int, float]]:
    order = np.argsort(-distribution, kind="stable")[:top]
    return [(int(t), float(distribution[t])) for t in order if distribution[t] > 0]


def _chain_step(trace: dict, top: int, new_tokens: list[int]) -> Step:
    n = int(trace["accepted"])
    drafts = [Draft(int(trace["tokens"][i]), float(trace["p_x"][i]), float(trace["q_x"][i]),
                    float(trace["u"][i]), i < n)
              for i in range(min(int(trace["drafted"]), n + 1))]
    from_residual = n < int(trace["drafted"])
    return Step(drafts, _top(trace["residual"], top) if from_residual else [],
                int(trace["emitted"]), from_residual, new_tokens)


def _coupled_step(trace: dict, top: int, new_tokens: list[int]) -> CoupledStep:
    """A coupled step, chain or tree: the positions up to the first whose drafts all differ
    from the target's draw."""
    positions = []
    if "tree_tokens" in trace:
        tokens, parent, valid = trace["tree_tokens"], trace["parent"], trace["valid"]
        node, path = 0, trace["path"]
        for d in range(int(trace["accepted_depth"]) + 1):
            kids = [int(tokens[m]) for m in range(1, len(tokens)) if parent[m] == node and valid[m]]
            kept = d < int(trace["accepted_depth"])
            positions.append(Position(d + 1, int(trace["draw"][d]), kids, kept))
            node = int(path[d]) if kept else node
    else:
        n, drafted = int(trace["accepted"]), int(trace["drafted"])
        for i in range(n + 1):
            positions.append(Position(i + 1, int(trace["draw"][i]),
                                      [int(trace["tokens"][i])] if i < drafted else [], i < n))
    return CoupledStep(positions, int(trace["emitted"]), new_tokens)


def _tree_step(trace: dict, top: int, new_tokens: list[int]) -> TreeStep:
    tokens, parent = trace["tree_tokens"], trace["parent"]
    nodes = [(i, int(parent[i]), int(tokens[i])) for i in range(1, len(tokens))
             if trace["valid"][i]]
    trials, path = [], []
    depth, width = trace["node"].shape
    for d in range(depth):
        for r in range(width):
            node = int(trace["node"][d, r])
            if node < 0:
                continue
            accepted = bool(trace["accepted"][d, r])
            trials.append(Trial(d + 1, r, node, int(parent[node]), int(tokens[node]),
                                float(trace["p_x"][d, r]), float(trace["q_x"][d, r]),
                                float(trace["u"][d, r]), accepted,
                                [] if accepted else _top(trace["residual"][d, r], top)))
            if accepted:
                path.append(node)
    from_residual = bool(trace["from_residual"])
    return TreeStep(nodes, trials, path, _top(trace["final"], top) if from_residual else [],
                    int(trace["emitted"]), from_residual, new_tokens)


@says_where_options_went
def explain(target: Model, prompt, method: Method | str,
            sampling: SamplingParams | None = None, *, steps: int = 4, top: int = 3,
            max_new_tokens: int | Sequence[int] = 64, seed: int | Sequence[int] = 0,
            eos_ids=None, mesh=None, kernels: bool | None = None, coupled: bool = False,
            rules: Rules | None = None) -> list[Step | TreeStep | CoupledStep]:
    """The first `steps` verify steps of one prompt, decoded with `generate`'s arguments and
    run options (its docstring says what each means; the method is one that verifies drafts,
    `METHODS`): `Step`s for a chain, `TreeStep`s for a tree (Medusa and EAGLE always draft
    one). `top` is how many of a residual's largest entries each step keeps. The numbers are
    those of the rules that chose the tokens: `rules`' own, when given, whose `verify` or
    `verify_tree` must then take `with_details` as the defaults do
    (`sampling.rules.returns_details`)."""
    method = method_of(method)
    if not method.drafts:
        names = ", ".join(map(repr, METHODS))
        raise GenerationError(f"explain shows verification: method {names}, not "
                              f"{method.name!r} (autoregressive decoding verifies nothing)")
    for name, value in (("steps", steps), ("top", top)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GenerationError(f"{name} must be an integer >= 1, got {value!r}")
    request = prepare(target, [prompt], method, sampling, max_new_tokens=max_new_tokens,
                      seed=seed, eos_ids=eos_ids, mesh=mesh, kernels=kernels, coupled=coupled,
                      rules=rules)
    rule = (request.spec.rules.verify if request.spec.method.tree is None else
            request.spec.rules.verify_tree)
    if not returns_details(rule):
        raise GenerationError(f"explain shows the numbers of the verification rule, and "
                              f"{getattr(rule, '__name__', rule)!r} does not return them: give "
                              "it a with_details keyword, as rejection.verify and "
                              "rejection.verify_tree have")
    spec = dataclasses.replace(request.spec, trace=True)
    state = loop.init(spec, request.weights, *request.inputs)
    # A step returns the state with its numbers (`state.trace`); start from zeros of that
    # structure, so that one program serves every step.
    shapes = jax.eval_shape(lambda s: loop.step(spec, request.weights, s), state).trace
    state = state.replace(trace=jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes))
    out = []
    while len(out) < steps and not bool(np.asarray(state.done)[0]):
        before = int(state.length[0])
        state = loop.step(spec, request.weights, state)
        trace = {name: np.asarray(value)[0] for name, value in state.trace.items()}
        new_tokens = np.asarray(state.tokens)[0, before:int(state.length[0])].tolist()
        kind = (_coupled_step if "draw" in trace else
                _tree_step if "tree_tokens" in trace else _chain_step)
        out.append(kind(trace, top, new_tokens))
    return out


def format_steps(steps: list[Step | TreeStep | CoupledStep], tokenizer=None) -> str:
    """The steps as text: one block per step, one line per drafted token (a chain) or per
    sibling test (a tree, indented by depth)."""
    def show(token: int) -> str:
        return repr(tokenizer.decode([token])) if tokenizer is not None else str(token)

    lines = []
    for i, step in enumerate(steps, 1):
        if isinstance(step, TreeStep):
            lines.extend(_format_tree_step(i, step, show))
            continue
        if isinstance(step, CoupledStep):
            lines.extend(_format_coupled_step(i, step, show))
            continue
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


def _format_tree_step(i: int, step: TreeStep, show) -> list[str]:
    depth = max((d for d in _depths(step.nodes).values()), default=0)
    lines = [f"step {i}: a tree of {len(step.nodes)} node(s), depth {depth}; "
             f"{len(step.trials)} sibling test(s)"]
    for t in step.trials:
        pad = "  " * t.depth
        verdict = "accept" if t.accepted else "reject"
        lines.append(f"{pad}node {t.node} (child {t.rank} of {t.parent}): x = {show(t.token):<12}"
                     f" p = {t.p:.4f}  q' = {t.q:.4f}  u = {t.u:.4f}  u*p = {t.u * t.p:.4f} "
                     f"{'<' if t.accepted else '>='} q'  -> {verdict}")
        if not t.accepted:
            top = ", ".join(f"{show(x)} {p:.4f}" for x, p in t.residual_top)
            lines.append(f"{pad}  q' <- normalize(max(q' - p_r, 0)), top: {top}")
    path = " ".join(show(dict((n, x) for n, _, x in step.nodes)[n]) for n in step.path)
    lines.append(f"  accepted path: {path or '(none)'}")
    if step.from_residual:
        top = ", ".join(f"{show(t)} {p:.4f}" for t, p in step.residual_top)
        lines.append(f"  emitted {show(step.emitted)} from the residual (top: {top})")
    else:
        lines.append(f"  emitted {show(step.emitted)} from q at the last accepted node")
    lines.append(f"  new tokens: {' '.join(show(t) for t in step.new_tokens)}")
    return lines


def _format_coupled_step(i: int, step: CoupledStep, show) -> list[str]:
    lines = [f"step {i}: {len(step.positions)} position(s) drawn by the target (coupled rule)"]
    for p in step.positions:
        drafts = ", ".join(show(t) for t in p.drafts) or "(none)"
        verdict = "kept" if p.kept else "no draft equals it: the draw is emitted"
        lines.append(f"  +{p.depth}: target draws {show(p.draw):<14} drafts {drafts}  -> {verdict}")
    lines.append(f"  emitted {show(step.emitted)}, the target's draw")
    lines.append(f"  new tokens: {' '.join(show(t) for t in step.new_tokens)}")
    return lines


def _depths(nodes: list[tuple[int, int, int]]) -> dict[int, int]:
    parent = {node: up for node, up, _ in nodes}

    def depth(node: int) -> int:
        return 0 if node == 0 else 1 + depth(parent[node])
    return {node: depth(node) for node in parent}
