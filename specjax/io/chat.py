"""Chat prompts: a model's chat template rendered the way Hugging Face transformers renders it.

transformers' `apply_chat_template` compiles `tokenizer_config.json`'s `chat_template` in a
sandboxed jinja2 environment with `trim_blocks` and `lstrip_blocks`, and passes `messages`,
`add_generation_prompt` and the special-token strings (`bos_token`, `eos_token`, ...). The
rendered text already holds the special tokens, so it is encoded without adding any more
(transformers tokenizes it with `add_special_tokens=False` too).
"""

from __future__ import annotations

import json

import jinja2
import jinja2.sandbox

from specjax.model.transformer import Model


class ChatTemplateError(ValueError):
    """The model has no chat template, or its template fails to render."""


def render(model: Model, user_message: str, system: str | None = None) -> str:
    """The prompt text for one user turn, ending where the assistant's reply begins."""
    messages = [{"role": "user", "content": user_message}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return render_messages(model, messages)


def render_messages(model: Model, messages: list) -> str:
    """The prompt text for a conversation ([{"role", "content"}, ...]), ending where the
    assistant's next reply begins."""
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and
               isinstance(m.get("content"), str) for m in messages):
        raise ChatTemplateError("messages must be objects with a string role and content")
    if not model.chat_template:
        raise ChatTemplateError(f"{model.name} has no chat template (no chat_template in its "
                                "tokenizer_config.json); drop --chat")

    def raise_exception(message):
        raise ChatTemplateError(f"{model.name}'s chat template refused the messages: {message}")

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters.setdefault("tojson", lambda x, **kw: json.dumps(x, **kw))
    try:
        template = env.from_string(model.chat_template)
        return template.render(messages=messages, add_generation_prompt=True,
                               **special_tokens(model))
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"{model.name}'s chat template does not render: {e}") from None


def encode(model: Model, text: str) -> list[int]:
    """Token ids of an already rendered chat prompt (its special tokens are in the text)."""
    if model.tokenizer is None:
        raise ChatTemplateError(f"{model.name} has no tokenizer.json; --chat needs one")
    return model.tokenizer.encode(text, add_special_tokens=False).ids


def special_tokens(model: Model) -> dict[str, str | None]:
    """bos_token / eos_token strings: from tokenizer_config.json, else from the config's ids."""
    found: dict[str, str | None] = {}
    file = model.path / "tokenizer_config.json" if model.path else None
    if file is not None and file.exists():
        try:
            config = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            config = {}
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(name)
            if isinstance(value, dict):            # older files: {"content": "<s>", ...}
                value = value.get("content")
            if isinstance(value, str):
                found[name] = value
    tokenizer, config = model.tokenizer, model.config
    if tokenizer is not None:
        if "bos_token" not in found and config.bos_token_id is not None:
            found["bos_token"] = tokenizer.id_to_token(config.bos_token_id)
        if "eos_token" not in found and config.eos_token_ids:
            found["eos_token"] = tokenizer.id_to_token(config.eos_token_ids[0])
    return found
