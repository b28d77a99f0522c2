"""The chat template called as apply_chat_template calls it, without its per-call work (re-checking and copying the
messages costs about as long as rendering; bench/export_speed). `DirectTemplate.probe` learns what apply_chat_template
hands the template, and is used only when rendering its probes directly gives apply_chat_template's text exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SHAPES = (("role", "content"), ("role", "content", "reasoning_content"))
_A, _R, _C, _U, _S = ("\u2063a\u2063", "\u2063r\u2063", "\u2063c\u2063", "\u2063u\u2063", "\u2063s\u2063")
_PROBES = [  # every value distinct, so that a normalized message shows which input each value came from
    [{"role": "system", "content": "S" + _S}, {"role": "user", "content": "U" + _U},
     {"role": "assistant", "content": "C" + _C, "reasoning_content": "R" + _R}, {"role": "user", "content": "V" + _U},
     {"role": "assistant", "content": "D" + _A}],
    [{"role": "user", "content": "W" + _U}, {"role": "assistant", "content": "E" + _A, "reasoning_content": "Q" + _R},
     {"role": "user", "content": "X" + _U}],
]


class DirectTemplate:
    """Renders a list of message lists; `render_many` equals apply_chat_template(..., tokenize=False)."""

    def __init__(self, template: Any, context: dict[str, Any],
                 shapes: dict[tuple[str, ...], list[tuple[str, str]]]):
        self.template = template
        self.context = context
        self.shapes = shapes  # input keys → [(output key, the input key its value comes from)]

    @classmethod
    def probe(cls, apply: Callable[..., Any], source: str) -> tuple[DirectTemplate | None, str]:
        """(the direct template, "") or (None, why not). `apply(messages, generation_prompt)` is
        the renderer's apply_chat_template call, `source` the template it renders."""
        import jinja2

        seen: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        original = jinja2.Template.render

        def spy(self: Any, *args: Any, **kwargs: Any) -> str:
            seen.append((self, args, kwargs))
            return original(self, *args, **kwargs)

        expected: list[tuple[list[dict[str, Any]], bool, str]] = []
        jinja2.Template.render = spy  # type: ignore[method-assign]
        try:
            for messages in _PROBES:
                for generation_prompt in (True, False):
                    expected.append((messages, generation_prompt, str(apply(messages, generation_prompt))))
        except Exception as e:  # the renderer's own call says what failed when it is used
            return None, f"the probe failed ({type(e).__name__})"
        finally:
            jinja2.Template.render = original  # type: ignore[method-assign]
        if len(seen) != len(expected) or any(args for _, args, _ in seen) or len({id(t) for t, _, _ in seen}) != 1:
            return None, "apply_chat_template does not render through one jinja2 template call"
        template, _, first = seen[0]
        context = {k: v for k, v in first.items() if k not in ("messages", "add_generation_prompt")}
        shapes: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for (messages, _, _), (_, _, kwargs) in zip(expected, seen, strict=True):
            if {k: v for k, v in kwargs.items() if k not in ("messages", "add_generation_prompt")} != context:
                return None, "apply_chat_template's variables change between calls"
            given = kwargs.get("messages")
            if not isinstance(given, list) or len(given) != len(messages):
                return None, "apply_chat_template changes the message list"
            for m, g in zip(messages, given, strict=True):
                key_of = {v: k for k, v in m.items()}
                if not isinstance(g, dict) or not all(isinstance(v, str) and v in key_of for v in g.values()):
                    return None, "apply_chat_template changes a message's values"
                shape = [(k, key_of[v]) for k, v in g.items()]
                if shapes.setdefault(tuple(m), shape) != shape:
                    return None, "apply_chat_template makes different messages of one shape"
        if set(shapes) != set(SHAPES):
            return None, "the probes do not cover the message shapes"
        direct = cls(_remembering(template, source), context, shapes)
        for messages, generation_prompt, text in expected:
            if direct.render_many([messages], generation_prompt) != [text]:
                return None, "rendering the template directly differs from apply_chat_template"
        return direct, ""

    def render_many(self, conversations: list[list[dict[str, Any]]], generation_prompt: bool) -> list[str | None]:
        """Each conversation's text, None for one with a message of a shape the probes did not cover
        (or a value that is not a string) or no message: apply_chat_template renders those."""
        made: dict[int, dict[str, Any] | None] = {}  # id(message) → as the template gets it (alive for this call)
        out: list[str | None] = []
        for messages in conversations:
            given = [made[id(m)] if id(m) in made else made.setdefault(id(m), self._normalized(m)) for m in messages]
            out.append(None if not given or None in given else str(self.template.render(
                messages=given, add_generation_prompt=generation_prompt, **self.context)))
        return out

    def _normalized(self, message: dict[str, Any]) -> dict[str, Any] | None:
        shape = self.shapes.get(tuple(message))
        if shape is None or any(type(v) is not str for v in message.values()):
            return None
        return {key: message[source] for key, source in shape}


def _remembering(template: Any, source: str) -> Any:
    """The template compiled again in an overlay of its environment that remembers the sandbox's
    attribute checks (jinja2's SandboxedEnvironment.is_safe_attribute and the immutable one's
    depend only on the object's type and the attribute's name); other environments: as it is."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    env = template.environment
    if type(env) not in (SandboxedEnvironment, ImmutableSandboxedEnvironment):
        return template
    overlay = env.overlay()
    check = type(env).is_safe_attribute
    known: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        safe = known.get(key)
        if safe is None:
            safe = known[key] = check(overlay, obj, attr, value)
        return safe

    overlay.is_safe_attribute = is_safe_attribute
    compiled = overlay.from_string(source)
    compiled.globals = dict(compiled.globals)  # a ChainMap is copied key by key in Python at every render
    return compiled
