"""Constrained output: a regex or a JSON schema as a token-level automaton, run on the device.

`compile_regex` and `compile_json_schema` turn a pattern and a tokenizer's vocabulary into an
`Automaton`: a table of states by tokens whose entry is the next state, or -1 where the token is
forbidden, with the start state and the accepting states. The automaton is built by
outlines-core (dottxt-ai/outlines-core), the library vLLM, SGLang and transformers use for the
same job: it compiles a regex to a byte-level DFA and walks every token's bytes through it, in
Rust, and builds a JSON schema's regex; it is kept by the Outlines authors and is small (a wheel,
no model). We choose it over writing a regex engine here: the hard parts (byte-level
determinisation, the JSON schema's grammar) are exactly what it does, and what is ours is the
table and its exact use.

In decoding (`Constraint`, `constrain`), every row carries its automaton's state after its
tokens (`DecodeState.fsm`); the target's logits at each position are masked to the tokens the
state after the prompt, the output and the drafts before that position allows, and renormalised
by the sampling transforms: the constrained target is the law. A forbidden draft then has q = 0
and is rejected by every verification rule; the drafters steer their own logits by the same
mask (`decoding.extras.steered`), so they rarely propose one. In an accepting
state the row's stop ids (its EOS ids) are allowed, so output that reaches an accepting state
with no way on can only stop.

A row without a constraint sits in state 0, a state that allows every token and loops.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["Automaton", "Constraint", "ConstraintError", "advance", "compile_json_schema",
           "compile_regex", "constrain", "constraints_of", "token_bytes"]


class ConstraintError(ValueError):
    """A pattern or schema that cannot be compiled, or that no token can start."""


@dataclasses.dataclass(frozen=True, eq=False)
class Automaton:
    """A token-level automaton (numpy): `table[s, v]` is the state after token v in state s, or
    -1 where v is forbidden; `accepting[s]` whether the text so far is a full match."""
    table: np.ndarray          # [S, V] int32
    start: int
    accepting: np.ndarray      # [S] bool
    pattern: str               # the regex it was compiled from

    @property
    def states(self) -> int:
        return self.table.shape[0]

    def matches(self, tokens) -> bool:
        """Whether these tokens, from the start, end in an accepting state."""
        state = self.start
        for token in tokens:
            state = int(self.table[state, token])
            if state < 0:
                return False
        return bool(self.accepting[state])


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 byte values (its byte-level BPE's alphabet)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@functools.lru_cache(maxsize=8)
def token_bytes(tokenizer, vocab_size: int) -> dict[bytes, list[int]]:
    """Each ordinary token's bytes -> its ids: a byte-level BPE's tokens through GPT-2's byte
    alphabet, a SentencePiece vocabulary's with "▁" as a space and <0xNN> as that byte. Special
    tokens (the added ones: EOS, chat markers) are left out: no text spells them."""
    special = set(tokenizer.get_added_tokens_decoder())
    byte_level = "ByteLevel" in type(tokenizer.decoder).__name__ if tokenizer.decoder else False
    inverse = {c: b for b, c in _bytes_to_unicode().items()}
    out: dict[bytes, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i in special or i >= vocab_size:
            continue
        if byte_level:
            if not all(c in inverse for c in token):
                continue
            data = bytes(inverse[c] for c in token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            data = bytes([int(token[3:5], 16)])
        else:
            data = token.replace("▁", " ").encode()
        out.setdefault(data, []).append(i)
    return out


def compile_regex(pattern: str, tokenizer, vocab_size: int) -> Automaton:
    """A regex over the text as an automaton over this tokenizer's tokens (outlines-core)."""
    if not isinstance(pattern, str) or not pattern:
        raise ConstraintError(f"regex must be a non-empty string, got {pattern!r}")
    return from_vocabulary(pattern, token_bytes(tokenizer, vocab_size), vocab_size)


def _outlines():
    # Lazy: outlines-core is an optional extra (`constraints`), needed only by regex= and
    # json_schema=.
    try:
        import outlines_core
        import outlines_core.json_schema
    except ImportError:
        raise ConstraintError("regex= and json_schema= need outlines-core: pip install "
                              "'specjax[constraints]'") from None
    return outlines_core


def compile_json_schema(schema, tokenizer, vocab_size: int) -> Automaton:
    """A JSON schema (a dict or its JSON text) as an automaton: outlines-core writes its regex
    (with at most one space between tokens), then `compile_regex`."""
    build_regex_from_schema = _outlines().json_schema.build_regex_from_schema
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        json.loads(text)
        pattern = build_regex_from_schema(text)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"json_schema cannot be compiled: {e}") from None
    except BaseException as e:      # outlines-core's Rust panics surface as PanicException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise ConstraintError(f"json_schema cannot be compiled: {e}") from None
    return compile_regex(pattern, tokenizer, vocab_size)


def from_vocabulary(pattern: str, tokens: dict[bytes, list[int]], vocab_size: int) -> Automaton:
    """The automaton of `pattern` over a vocabulary given as {bytes: ids} (any token-level
    alphabet: tests build one of single letters)."""
    Index, Vocabulary = _outlines().Index, _outlines().Vocabulary
    eos = vocab_size                       # outlines-core's end token, outside the ids used
    try:
        index = Index(pattern, Vocabulary(eos, tokens))
    except BaseException as e:             # a bad regex: ValueError, or a Rust panic
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        if "incompatible with the regex" in str(e):
            raise ConstraintError(f"no token of the vocabulary can continue a match of "
                                  f"{pattern!r} ({e})") from None
        raise ConstraintError(f"regex {pattern!r} cannot be compiled: {e}") from None
    transitions = index.get_transitions()
    finals = set(index.get_final_states())
    states = sorted(set(transitions) | finals)
    number = {s: i for i, s in enumerate(states)}
    table = np.full((len(states), vocab_size), -1, np.int32)
    for s, moves in transitions.items():
        for token, to in moves.items():
            if token != eos:
                table[number[s], token] = number[to]
    accepting = np.array([s in finals for s in states], bool)
    start = number[index.get_initial_state()]
    if not (table[start] >= 0).any() and not accepting[start]:
        raise ConstraintError(f"no token of the vocabulary can start a match of {pattern!r}")
    return Automaton(table, start, accepting, pattern)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Constraint:
    """The rows' automata as data: one table for the batch, each row's automaton at its own
    offset (state 0 the free state), and each row's start state; `active` [B] which rows have
    one. A row's stop ids are allowed in its automaton's accepting states (its own copy)."""
    table: jax.Array           # [S, V] int32, -1 forbidden
    start: jax.Array           # [B] int32
    active: jax.Array          # [B] bool


STATE_BUCKET = 64


def constraints_of(automata: list[Automaton | None], stop_ids: np.ndarray,
                   vocab: int) -> Constraint:
    """The `Constraint` of a batch: row b follows automata[b] (None: free). Rows with the same
    automaton and stop ids share one copy; the table's states are padded to a multiple of
    STATE_BUCKET so that other patterns rarely recompile."""
    blocks, offsets, starts = [np.zeros((1, vocab), np.int32)], {}, []
    size = 1
    for automaton, stops in zip(automata, stop_ids):
        if automaton is None:
            starts.append(0)
            continue
        stops = tuple(int(s) for s in stops if 0 <= s < vocab)
        key = (id(automaton), stops)
        if key not in offsets:
            table = np.where(automaton.table >= 0, automaton.table + size, -1).astype(np.int32)
            if automaton.table.shape[1] < vocab:           # padded ids are never allowed
                table = np.pad(table, ((0, 0), (0, vocab - table.shape[1])), constant_values=-1)
            finals = np.flatnonzero(automaton.accepting)
            for s in stops:
                table[finals, s] = finals + size
            offsets[key] = size
            blocks.append(table)
            size += automaton.states
        starts.append(offsets[key] + automaton.start)
    padded = -(-size // STATE_BUCKET) * STATE_BUCKET if size > 1 else 1
    table = np.concatenate(blocks + [np.full((padded - size, vocab), -1, np.int32)])
    return Constraint(table=table, start=np.asarray(starts, np.int32),
                      active=np.asarray([a is not None for a in automata], bool))


def advance(table, state, tokens, count=None):
    """The states after feeding `tokens` [B, W] (the first `count` [B] of them; all without)
    from `state` [B]; -1 once a token was forbidden."""
    width = tokens.shape[1]
    count = jnp.full(state.shape, width) if count is None else count

    def one(j, s):
        nxt = table[jnp.maximum(s, 0), tokens[:, j]]
        return jnp.where((j < count) & (s >= 0), nxt, s)
    return lax.fori_loop(0, width, one, state)


def constrain(logits, constraint: Constraint, state, drafted=None):
    """Logits [B, N, V] with each position's forbidden tokens at -inf: the state there is the
    row's `state` [B] advanced along the drafts before the position (`drafted` [B, N, E], -1
    where none). A position after a forbidden draft (state -1) is never reached: it allows
    nothing. A batch without constrained rows returns the logits as they are."""
    def masked():
        b, n = logits.shape[:2]
        here = jnp.broadcast_to(state[:, None], (b, n))
        if drafted is not None and drafted.shape[-1]:
            def one(e, s):
                token = drafted[:, :, e]
                nxt = constraint.table[jnp.maximum(s, 0), jnp.maximum(token, 0)]
                return jnp.where(token >= 0, jnp.where(s >= 0, nxt, -1), s)
            here = lax.fori_loop(0, drafted.shape[-1], one, here)
        allowed = (constraint.table[jnp.maximum(here, 0)] >= 0) & (here >= 0)[..., None]
        return jnp.where(allowed, logits, -jnp.inf)
    return lax.cond(jnp.any(constraint.active), masked, lambda: logits)
