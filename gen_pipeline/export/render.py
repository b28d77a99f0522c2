"""The target's tokenizer and chat template (the optional `template` extra), loaded offline, rendering as the
trainers and the server do: apply_chat_template(messages, tokenize=False, ...), then the tokenizer on the text
without special tokens (SpecForge's GeneralParser, specforge/data/parse.py:136-144 and 272-278)."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gen_pipeline.config.server import ServerProfile
from gen_pipeline.errors import ConfigError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # the markers of SGLang's qwen3 / kimi_k2 / deepseek-r1 parsers
INSTALL_HINT = ("make venv EXTRAS=gpu on the GPU node (the one install that every make target runs with); into "
                "another Python: pip install -e '.[template]' from the checkout (transformers + jinja2)")
KWARGS_KEY = "chat_template_kwargs"  # meta key: what a sample's requests sent to the template (run/chat.py)
_PROBE_USER, _PROBE_ANSWER = "U\u2063probe", "A\u2063probe"  # text no template adds on its own


def tokenizer_source(tokenizer: str | None, profile: ServerProfile | None) -> tuple[str | None, str, bool]:
    """(--tokenizer, else the --server profile's --tokenizer-path or model_path, else None; how messages name
    where it came from; the profile's trust_remote_code)."""
    trust = bool(profile and profile.trust_remote_code)
    if tokenizer or profile is None:
        return tokenizer or None, "--tokenizer", trust
    return profile.tokenizer_path, f"--server {profile.name}: its model", trust


@dataclass
class Renderer:
    """One tokenizer with its chat template; `kwargs` go to every render (chat_template_kwargs)."""

    tokenizer: Any
    source: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    _direct: Any = field(default=None, init=False, repr=False)  # direct.DirectTemplate, False: none (direct_why)
    direct_why: str = field(default="", init=False)
    _end_of_turn: str | None = field(default=None, init=False, repr=False)  # markers()[1], once
    _others: dict[bytes, Renderer] = field(default_factory=dict, init=False, repr=False)  # for_kwargs

    def render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        return str(self._apply(messages, generation_prompt))

    def render_many(self, conversations: list[list[dict[str, Any]]], *, generation_prompt: bool) -> list[str]:
        """`render` of each conversation in one call of apply_chat_template (its batch form pays the call's own work
        once); an empty conversation would be taken for a flat list, so then one call each."""
        if not all(conversations):
            return [self.render(m, generation_prompt=generation_prompt) for m in conversations]
        return [str(t) for t in self._apply(conversations, generation_prompt)] if conversations else []

    def _apply(self, conversation: Any, generation_prompt: bool) -> Any:
        """apply_chat_template(conversation, tokenize=False, ...); ConfigError when the template fails."""
        try:
            return self.tokenizer.apply_chat_template(conversation, tokenize=False,
                                                      add_generation_prompt=generation_prompt, **self.kwargs)
        except Exception as e:  # jinja2's TemplateError and what the template raises itself
            raise self._failed(e) from None

    def _failed(self, e: Exception) -> ConfigError:
        return ConfigError(f"the chat template of {self.source} failed on a conversation ({type(e).__name__}: {e}).")

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def markers(self) -> tuple[str, str]:
        """(assistant header, end of turn) as this template writes them: the text before an answer
        (less a think opener) and the text after it; what a SpecForge ChatTemplate declares."""
        user = [{"role": "user", "content": _PROBE_USER}]
        gen = self.render(user, generation_prompt=True)
        full = self.render(user + [{"role": "assistant", "content": _PROBE_ANSWER}], generation_prompt=False)
        base = self.render(user, generation_prompt=False)
        at = full.find(_PROBE_ANSWER)
        if not full.startswith(base) or at < 0:
            raise ConfigError(f"the chat template of {self.source} does not render a user turn then an "
                              "assistant turn as a prefix of each other; check-template cannot find its turns.")
        turn_head = full[len(base):at]
        gen_head = gen[len(base):] if gen.startswith(base) else turn_head
        common = os.path.commonprefix([turn_head, gen_head])
        header = common[:-len(THINK_OPEN)] if common.endswith(THINK_OPEN) else common
        return header or turn_head, full[at + len(_PROBE_ANSWER):]

    def cut_end(self, output: str, turn: dict[str, Any]) -> str:
        """A turn the model did not end (max_new_tokens, a loop cut) up to where it stopped: without the template's
        end of turn, and, with no answer (cut while thinking), without the think block's close."""
        if self._end_of_turn is None:
            self._end_of_turn = self.markers()[1]
        end = self._end_of_turn
        output = output[:-len(end)] if end and output.endswith(end) else output
        if turn.get("reasoning_content") and not (turn.get("content") or "").strip():
            close = output.rfind(THINK_CLOSE)
            output = output[:close].rstrip("\n") if close >= 0 and not output[close + len(THINK_CLOSE):].strip() \
                else output
        return output

    def turn_text(self, history: list[dict[str, Any]], turn: dict[str, Any]) -> tuple[str, str]:
        """(the prompt the server rendered for `turn`, the turn's text after it with its reasoning in the model's
        think block); ConfigError when the turn does not continue its generation prompt."""
        prompt = self.render(history, generation_prompt=True)
        full = self.render([*history, turn], generation_prompt=False)
        return self._split_turn(prompt, full, turn)

    def turn_texts(self, turns: list[tuple[list[dict[str, Any]], dict[str, Any]]], *,
                   direct: bool = True) -> list[tuple[str, str]]:
        """`turn_text` of many (history, turn) pairs, the same texts: the template called directly
        (direct.py) where its probes render as apply_chat_template does, else in its batch form."""
        # with tools (a tool-use sample's): apply_chat_template itself, the direct path's probes know no tools
        render = self._fast_render if direct and "tools" not in self.kwargs else self.render_many
        prompts = render([h for h, _ in turns], generation_prompt=True)
        fulls = render([[*h, t] for h, t in turns], generation_prompt=False)
        return [self._split_turn(p, f, t) for p, f, (_, t) in zip(prompts, fulls, turns, strict=True)]

    def _fast_render(self, conversations: list[list[dict[str, Any]]], *, generation_prompt: bool) -> list[str]:
        if self._direct is None:
            from gen_pipeline.export.direct import DirectTemplate

            try:
                source = self.tokenizer.get_chat_template()
            except Exception:  # apply_chat_template will say what is wrong with it
                source = None
            direct, self.direct_why = (DirectTemplate.probe(self._apply, source) if isinstance(source, str)
                                       else (None, "no chat template source"))
            self._direct = direct or False
        direct = self._direct
        if not direct:
            return self.render_many(conversations, generation_prompt=generation_prompt)
        try:
            texts = direct.render_many(conversations, generation_prompt)
        except Exception as e:  # what apply_chat_template would have raised: the same message
            raise self._failed(e) from None
        others = iter(self.render_many([m for m, t in zip(conversations, texts, strict=True) if t is None],
                                       generation_prompt=generation_prompt))
        return [t if t is not None else next(others) for t in texts]

    def _split_turn(self, prompt: str, full: str, turn: dict[str, Any]) -> tuple[str, str]:
        if not full.startswith(prompt):
            raise ConfigError(f"the chat template of {self.source} renders an assistant turn that does not "
                              "continue its own generation prompt, so the turn's tokens cannot be rebuilt from "
                              "text: record the server's token ids at generation time instead.")
        return prompt, with_reasoning(prompt, full[len(prompt):], turn.get("reasoning_content") or "")

    def for_kwargs(self, kwargs: dict[str, Any] | None) -> Renderer:
        """This tokenizer rendering with `kwargs` (a sample's recorded chat_template_kwargs); None: this
        renderer's own (--template-kwargs). One renderer per distinct value, kept."""
        if kwargs is None or kwargs == self.kwargs:
            return self
        key = orjson.dumps(kwargs, option=orjson.OPT_SORT_KEYS)
        if (other := self._others.get(key)) is None:
            other = self._others[key] = Renderer(self.tokenizer, self.source, dict(kwargs))
        return other


def with_reasoning(prompt: str, out: str, reasoning: str) -> str:
    """The turn's text after `prompt` with its reasoning in the model's think block (the prompt's or the
    turn's first: kept, or filled when empty; else one added before the turn), decided by position, never
    by searching for the reasoning's text, which the answer may repeat."""
    if not reasoning:
        return out
    if prompt.rstrip().endswith(THINK_OPEN):  # the prompt opened thinking: the block starts the turn
        start = 0
    else:
        opened = out.find(THINK_OPEN)
        start = opened + len(THINK_OPEN) if opened >= 0 else -1
    close = out.find(THINK_CLOSE, start) if start >= 0 else -1
    if close < 0:  # no think block in the turn: the model wrote one before its answer
        return THINK_OPEN + reasoning + THINK_CLOSE + out
    if out[start:close].strip():  # the template rendered the reasoning there
        return out
    return out[:start] + reasoning + out[close:]  # an empty block (or the prompt's, closed at once): fill it


def recorded_kwargs(sample: dict[str, Any]) -> dict[str, Any] | None:
    """meta.chat_template_kwargs of a sample (JSON text: what its requests sent to the chat template), None
    when the row has none (written before they were recorded); ConfigError naming the sample if unreadable."""
    meta = sample.get("meta")
    value = meta.get(KWARGS_KEY) if isinstance(meta, dict) else None
    if value is None:
        return None
    try:
        kwargs = orjson.loads(value) if isinstance(value, str) else value
    except orjson.JSONDecodeError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"sample {sample.get('id')}: meta.{KWARGS_KEY} = {value!r} is not a JSON object; the "
                          "row is damaged. Run `gen-pipeline validate` on its dataset.")
    return kwargs


def load_renderer(source: str | None, *, kwargs: dict[str, Any] | None = None, trust_remote_code: bool = False,
                  flag: str = "--tokenizer") -> Renderer:
    """The tokenizer at `source` (a folder, or a hub id already in the local cache), offline.
    Raises ConfigError that says how to install the extra or what to pass."""
    if source is None:
        raise ConfigError("no tokenizer: pass --tokenizer PATH (the target model's folder, or one with its "
                          "tokenizer files and chat template), or --server NAME to use that profile's model.")
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("jinja2") is None:
        raise ConfigError(f"rendering chat templates needs transformers and jinja2, which are not installed: "
                          f"{INSTALL_HINT}.")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as e:  # OSError, ValueError, what remote code raises: all mean "not here"
        hint = ("Does that folder hold the tokenizer files (tokenizer.json, tokenizer_config.json)?"
                if Path(source).exists() else "It is neither a folder here nor a hub model in the local cache: "
                "pass --tokenizer with the model's folder.")
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"{flag} {source}: the tokenizer does not load offline ({type(e).__name__}: {first}). "
                          f"{hint}") from None
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"{flag} {source}: the tokenizer has no chat template (tokenizer_config.json "
                          "chat_template or chat_template.jinja); the trainers render conversations with it.")
    return Renderer(tok, source, dict(kwargs or {}))


def parse_template_kwargs(text: str) -> dict[str, Any]:
    """--template-kwargs JSON → chat_template_kwargs; raises ConfigError naming the flag."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"--template-kwargs {text!r} is not JSON ({e}); give an object, e.g. "
                          '\'{"thinking": true}\'.') from None
    if not isinstance(value, dict):
        raise ConfigError(f"--template-kwargs {text!r} must be a JSON object (keys → chat template variables).")
    return value
