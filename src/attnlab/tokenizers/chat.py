"""Chat templates: a Hugging Face directory's `chat_template`, rendered as transformers'
`apply_chat_template(messages, add_generation_prompt=True)` renders it.

The template is Jinja (tokenizer_config.json's "chat_template", a string or a list of named
ones, or the file chat_template.jinja), run in a sandbox with the names transformers gives
it: `messages`, `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, ...),
`raise_exception`, `strftime_now` and a `tojson` filter. jinja2 comes with torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def read_chat_template(directory: Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The directory's default chat template, or None."""
    if (directory / TEMPLATE_FILE).is_file():
        return (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use"}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def special_token_texts(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """{"bos_token": "<s>", ...} as tokenizer_config.json names them (strings or
    {"content": ...})."""
    texts = {}
    for name in SPECIAL_NAMES:
        value = tokenizer_config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            texts[name] = value
    return texts


def render_chat(template: str, messages: Sequence[Mapping[str, str]], *,
                special: Mapping[str, str] | None = None,
                add_generation_prompt: bool = True, **variables: Any) -> str:
    """The prompt text of `messages` ([{"role": "user", "content": "..."}, ...]); `variables`
    are the template's own switches, as apply_chat_template's extra keyword arguments
    (Qwen3: enable_thinking=False)."""
    try:
        import jinja2
        import jinja2.ext  # a submodule `import jinja2` leaves out: loopcontrols is in it
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as err:
        raise ImportError("jinja2 renders chat templates and is missing: pip install "
                          "'attnlab[bpe]'") from err

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused these messages: {message}")

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as err:
        raise ValueError(f"the chat template is not valid Jinja ({err})") from err
    try:
        return compiled.render(messages=[dict(m) for m in messages],
                               add_generation_prompt=add_generation_prompt,
                               **{**(special or {}), **variables})
    except (jinja2.TemplateError, TypeError, ArithmeticError) as err:
        # UndefinedError: a Llama 2 template's bos_token where tokenizer_config.json has none
        raise ValueError(
            f"the chat template failed on these messages ({type(err).__name__}: {err}); a "
            f"special token it names may be missing from tokenizer_config.json (it defines "
            f"{sorted(special or {}) or 'none'}), or the template is broken: fix "
            "'chat_template' there or chat_template.jinja") from err
