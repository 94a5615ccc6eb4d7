"""A Hugging Face model directory as far as its tokenizer goes: recognising one
(`is_hf_dir`, `read_hf_config`), its tokenizer.json with the special tokens and chat template
the directory declares (`HFDirTokenizer`, `load_hf_tokenizer`), and attnlab's own tokenizers
in tokenizer.json form (`as_hf_backend`). The weights are `attnlab.hf`'s business.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .chat import read_chat_template, render_chat, special_token_texts
from .core import (
    EOT,
    WORD_PATTERN,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    WordTokenizer,
    import_tokenizers,
)
from .token_bytes import bytes_as_chars

CONFIG_FILE = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
# copied next to an exported model when the source directory has them
TOKENIZER_FILES = ("tokenizer.json", TOKENIZER_CONFIG, "chat_template.jinja",
                   "special_tokens_map.json", GENERATION_CONFIG, "vocab.json", "merges.txt")


class NoTokenizerError(FileNotFoundError):
    """A Hugging Face directory without tokenizer files (the weights may still be fine)."""


def is_hf_dir(path: str | Path) -> bool:
    """True when `path` is a directory whose config.json is a Hugging Face one (model_type)."""
    config = Path(path) / CONFIG_FILE
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text())
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        return False


def read_hf_config(directory: str | Path) -> dict[str, Any]:
    """config.json of a Hugging Face directory; errors say what is missing or wrong."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise FileNotFoundError(f"Hugging Face model directory {directory} does not exist")
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG_FILE}; a Hugging Face model directory needs "
            f"{CONFIG_FILE} and model.safetensors (save one with model.save_pretrained(dir))"
        )
    try:
        hf_config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON ({err})") from err
    if not isinstance(hf_config, dict) or "model_type" not in hf_config:
        raise ValueError(
            f"{config_path} has no model_type, so it is not a Hugging Face config "
            "(an attnlab checkpoint? load it with load_checkpoint)"
        )
    return hf_config


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err})") from err
    return value if isinstance(value, dict) else {}


def eos_field(stop_ids: Sequence[int]) -> int | list[int] | None:
    """The "eos" of `special_token_ids` (and generation_config.json's eos_token_id) for
    these stop ids: the one id, a list when there are several, None when none."""
    return list(stop_ids) if len(stop_ids) > 1 else (stop_ids[0] if stop_ids else None)


def special_token_ids(directory: Path, tokenizer: HFTokenizer) -> dict[str, Any]:
    """{"bos": id, "eos": id or [ids], "pad": id, "add_bos": bool} from
    generation_config.json (ids win), tokenizer_config.json (token strings) and config.json;
    absent ones are None. "eos" is a list when the directory lists several."""
    generation = read_json(directory / GENERATION_CONFIG)
    tok_config = read_json(directory / TOKENIZER_CONFIG)
    model_config = read_json(directory / CONFIG_FILE)
    text = model_config.get("text_config")  # a multimodal release's (Llama 4's) language model
    if isinstance(text, dict):
        model_config = {**text, **model_config}

    def token_id(kind: str) -> int | list[int] | None:
        for source in (generation, model_config):
            value = source.get(f"{kind}_token_id")
            if isinstance(value, list):  # several EOS ids: generation stops at any of them
                value = [i for i in value if isinstance(i, int)]
                value = value if kind == "eos" and len(value) > 1 else (value or [None])[0]
            if isinstance(value, int | list):
                return value
        token = tok_config.get(f"{kind}_token")
        if isinstance(token, dict):  # {"content": "<s>", ...}
            token = token.get("content")
        found = tokenizer.backend.token_to_id(token) if isinstance(token, str) else None
        return found if isinstance(found, int) else None

    return {"bos": token_id("bos"), "eos": token_id("eos"), "pad": token_id("pad"),
            "add_bos": bool(tok_config.get("add_bos_token", False))}


class ChatText(str):
    """A prompt a chat template rendered (`HFDirTokenizer.chat_prompt`). The template writes
    every special token the model wants, so `encode` adds none, as transformers'
    apply_chat_template(tokenize=True) encodes with add_special_tokens=False: a template
    without the BOS gets none, and the text after a BOS it writes is not the text's start
    (a Metaspace prepend_scheme="first" tokenizer puts no "▁" before it)."""


class HFDirTokenizer(HFTokenizer):
    """A Hugging Face directory's tokenizer.json with its special tokens: generation stops at
    its EOS, and the BOS is prepended when tokenizer_config.json asks for it and the
    tokenizer.json post-processor does not already add it (as transformers encodes)."""

    def __init__(self, backend: Any, name: str, special: dict[str, Any],
                 source: Path | None = None, chat: dict[str, Any] | None = None) -> None:
        super().__init__(backend, name=name)
        self.source = source  # the directory it came from: save_hf copies its files
        # {"template": Jinja text, "tokens": {"bos_token": "<s>", ...}} or None (hf/chat.py)
        self.chat = chat
        self.bos_id: int | None = special["bos"]
        eos = special["eos"]
        self.eos_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (
            () if eos is None else (eos,))
        if self.eos_ids:
            self.eot_id = self.eos_ids[0]  # pads an ended row; the others stop it too
        pad = special["pad"] if special["pad"] is not None else self.eot_id
        self.pad_id = pad if pad is not None else 0
        self.add_bos = bool(special["add_bos"] and self.bos_id is not None
                            and self._probe()[:1] != [self.bos_id])

    def _probe(self) -> list[int]:
        """What the backend makes of "a": does its own template already add the BOS?"""
        try:
            return self._encode("a", special=True)
        except ValueError:  # a vocabulary without "a" (and no unknown token)
            return []

    def encode(self, text: str) -> list[int]:
        if isinstance(text, ChatText):  # its template wrote the special tokens
            return self._encode(text, special=False)
        ids = super().encode(text)
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.eos_ids or super().stop_ids

    def special(self) -> dict[str, Any]:
        """The special tokens as `__init__` takes them (what a checkpoint saves)."""
        return {"bos": self.bos_id, "eos": eos_field(self.stop_ids), "pad": self.pad_id,
                "add_bos": self.add_bos}

    def chat_prompt(self, messages: Sequence[dict[str, str]], *,
                    add_generation_prompt: bool = True, **variables: Any) -> ChatText:
        """The text of `messages` in the directory's chat template, as transformers'
        apply_chat_template renders it (`variables`: its extra keyword arguments, e.g.
        enable_thinking=False); encode(chat_prompt(m)) gives apply_chat_template's ids
        (`ChatText`: the BOS only where the template writes it)."""
        if not self.chat:
            raise ValueError(f"tokenizer {self.name!r} has no chat template "
                             "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
        return ChatText(render_chat(self.chat["template"], messages,
                                    special=self.chat["tokens"],
                                    add_generation_prompt=add_generation_prompt, **variables))

    def _config(self) -> dict[str, Any]:
        # saved with an attnlab checkpoint, so the same BOS is prepended and EOS stops
        return {**super()._config(), "special": self.special(), "chat": self.chat}

    @classmethod
    def from_saved(cls, plain: HFTokenizer, config: dict[str, Any]) -> HFDirTokenizer:
        """The tokenizer `_config` saved (its tokenizer.json already read into `plain`);
        TypeError naming a malformed "special" or "chat"."""
        special, chat = config["special"], config.get("chat")
        eos = special.get("eos") if isinstance(special, dict) else None
        eos_ok = eos is None or isinstance(eos, int) or (
            isinstance(eos, list) and bool(eos) and all(isinstance(i, int) for i in eos))
        if not (isinstance(special, dict) and isinstance(special.get("add_bos"), bool)
                and all(special.get(k) is None or isinstance(special.get(k), int)
                        for k in ("bos", "pad")) and eos_ok):
            raise TypeError(f"'special' must hold int-or-null bos and pad, an int, a list of "
                            f"ints or null eos and a bool add_bos, got {special!r}")
        if chat is not None and not (isinstance(chat, dict)
                                     and isinstance(chat.get("template"), str)
                                     and isinstance(chat.get("tokens"), dict)):
            raise TypeError(f"'chat' must hold a str template and a dict of tokens, got "
                            f"{chat!r}")
        return cls(plain.backend, plain.name, special, chat=chat)

    def identity(self) -> str:  # encoded data differs with add_bos: keys its cache too
        blob = json.dumps(self.special(), sort_keys=True)
        return hashlib.sha256((self.backend.to_str() + blob).encode()).hexdigest()[:16]


def load_hf_tokenizer(directory: str | Path, vocab_size: int | None = None) -> Tokenizer:
    """The tokenizer of a Hugging Face directory: tokenizer.json (with its BOS/EOS), vocab.json
    + merges.txt, or (GPT-2's 50257 ids only) tiktoken's gpt2 encoding cached offline."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        plain = HFTokenizer.from_file(directory / "tokenizer.json")
        special = special_token_ids(directory, plain)
        tok_config = read_json(directory / TOKENIZER_CONFIG)
        template = read_chat_template(directory, tok_config)
        chat = None if template is None else {"template": template,
                                              "tokens": special_token_texts(tok_config)}
        return HFDirTokenizer(plain.backend, plain.name, special, source=directory, chat=chat)
    if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        tk = import_tokenizers()
        backend = tk.Tokenizer(tk.models.BPE.from_file(
            str(directory / "vocab.json"), str(directory / "merges.txt")
        ))
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tk.decoders.ByteLevel()
        backend.add_special_tokens([EOT])
        return HFTokenizer(backend, name="hf:gpt2-bpe")
    if vocab_size == 50257:
        try:
            return TiktokenTokenizer("gpt2")
        except (FileNotFoundError, ImportError) as err:
            raise FileNotFoundError(
                f"{directory} has no tokenizer.json (or vocab.json + merges.txt), and the "
                f"fallback failed: {err}"
            ) from err
    if (directory / "tokenizer.model").is_file():  # a sentencepiece model (Llama 2's repo)
        raise NoTokenizerError(
            f"{directory} has only tokenizer.model, a sentencepiece file attnlab does not "
            "read: write its tokenizer.json with transformers (pip install sentencepiece "
            f"protobuf): AutoTokenizer.from_pretrained('{directory}')"
            f".save_pretrained('{directory}')")
    raise NoTokenizerError(
        f"{directory} has no tokenizer: add tokenizer.json (tokenizer.save_pretrained(dir)) "
        "or vocab.json + merges.txt"
    )


def as_hf_backend(tokenizer: Tokenizer) -> Any:
    """A `tokenizers` Tokenizer with the same ids as attnlab's char, byte or word tokenizer
    (what transformers' PreTrainedTokenizerFast and `load_hf_tokenizer` read); None for
    other kinds."""
    if not isinstance(tokenizer, CharTokenizer | ByteTokenizer | WordTokenizer):
        return None
    tk = import_tokenizers()
    if isinstance(tokenizer, ByteTokenizer):  # 256 one-byte pieces, no merges
        chars = bytes_as_chars()
        backend = tk.Tokenizer(tk.models.BPE({chars[b]: b for b in range(256)}, []))
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                            use_regex=False)
        backend.decoder = tk.decoders.ByteLevel()
        return backend
    pieces, pattern = ((tokenizer.chars, r"[\s\S]") if isinstance(tokenizer, CharTokenizer)
                       else (tokenizer.words, WORD_PATTERN.pattern))
    backend = tk.Tokenizer(tk.models.WordLevel({p: i for i, p in enumerate(pieces)}))
    backend.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(pattern), behavior="isolated")
    backend.decoder = tk.decoders.Fuse()  # pieces carry their own spaces
    return backend
