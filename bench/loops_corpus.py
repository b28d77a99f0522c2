"""The texts `python -m bench loops` feeds the loop detector: natural text and code that no one here
wrote (what installed packages ship), legitimately repetitive outputs written here with a label,
and synthetic loops of each kind embedded at random points of natural text. Seeded: the same
machine gives the same corpus."""

from __future__ import annotations

import gzip
import hashlib
import math
import random
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# A turn is 300-8,000 model tokens; cut by characters at ~4 characters a token (the token counts
# the benchmark reports come from the simulator's tokenizer, sglang_sim/tokenizer.py).
TURN_MIN_CHARS, TURN_MAX_CHARS = 1_200, 32_000
MAX_PIECES_PER_FILE = 4
_LICENCE_NAME = re.compile(r"^(LICEN[CS]E|COPYING|COPYRIGHT|NOTICE)|^copyright$", re.I)
_DOC_SUFFIXES = {".md", ".rst", ".txt"}
_DOC_NAMES = re.compile(r"^(README|NEWS|CHANGES|CHANGELOG|changelog|AUTHORS|THANKS|TODO|HISTORY|FAQ)", re.I)


@dataclass(frozen=True)
class Turn:
    source: str  # file (and piece) it was cut from, or the generator's name
    text: str
    label: str = ""  # legitimately repetitive set: "keep" (must not be killed) or "may_kill"


@dataclass(frozen=True)
class LoopCase:
    kind: str
    text: str
    loop_start_char: int  # where the first copy of the repeated text begins


# -- natural text -----------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    return text if "\x00" not in text else None


def _kind(path: Path) -> str | None:
    name = path.name.removesuffix(".gz")
    if _LICENCE_NAME.search(name) or path.parent.name == "common-licenses":
        return "licences"
    suffix = Path(name).suffix
    if suffix == ".py":
        return "code"
    if suffix in (".html", ".htm"):
        return "html"
    if suffix in _DOC_SUFFIXES or _DOC_NAMES.search(name):
        return "docs"
    return None


def corpus_roots() -> list[Path]:
    return [Path(sysconfig.get_paths()["purelib"]), Path("/usr/share/doc"), Path("/usr/share/common-licenses")]


def _files(roots: list[Path]) -> dict[str, list[tuple[Path, str]]]:
    """(path, path relative to its root) per corpus, sorted by root then relative path."""
    out: dict[str, list[tuple[Path, str]]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            kind = _kind(path) if path.is_file() and not path.is_symlink() else None
            if kind is not None:
                out.setdefault(kind, []).append((path, path.relative_to(root).as_posix()))
    return out


def _dedupe_key(text: str) -> bytes:
    """Copies of one file (and of one licence with another copyright line) count once."""
    body = "\n".join(ln for ln in text.splitlines() if "copyright" not in ln.lower())
    return hashlib.blake2b(" ".join(body.split()).lower().encode(), digest_size=16).digest()


def _pieces(text: str, rng: random.Random) -> Iterator[str]:
    """Consecutive pieces of log-uniform size in [TURN_MIN_CHARS, TURN_MAX_CHARS], cut at line ends."""
    pos = 0
    for _ in range(MAX_PIECES_PER_FILE):
        size = int(math.exp(rng.uniform(math.log(TURN_MIN_CHARS), math.log(TURN_MAX_CHARS))))
        if len(text) - pos < TURN_MIN_CHARS:
            return
        end = text.find("\n", pos + size)
        end = len(text) if end < 0 or len(text) - end < TURN_MIN_CHARS // 2 else end + 1
        yield text[pos:end]
        pos = end


def natural_corpora(seed: int, max_turns: dict[str, int], roots: list[Path] | None = None) -> dict[str, list[Turn]]:
    """Turns per corpus (code, docs, licences, html): the distinct files in sorted order (root, then
    path within it), each cut into up to MAX_PIECES_PER_FILE pieces, until max_turns[corpus] turns.
    A file's pieces depend only on the seed, its path within its root and its text, so installing
    another package adds that package's turns and leaves every other turn as it was."""
    out: dict[str, list[Turn]] = {}
    for kind, paths in sorted(_files(roots or corpus_roots()).items()):
        if kind not in max_turns:
            continue
        seen: set[bytes] = set()
        turns: list[Turn] = []
        for path, rel in paths:
            text = _read(path)
            if text is None or len(text) < TURN_MIN_CHARS:
                continue
            key = _dedupe_key(text)
            if key in seen:
                continue
            seen.add(key)
            for k, piece in enumerate(_pieces(text, random.Random(f"{seed}:{rel}"))):
                turns.append(Turn(f"{path}#{k}", piece))
            if len(turns) >= max_turns[kind]:
                break
        out[kind] = turns[: max_turns[kind]]
    return out


# -- legitimately repetitive outputs -----------------------------------------------------------
_WORD_RE = re.compile(r"[A-Za-z]{3,12}")


def vocabulary(texts: list[str], size: int = 3000) -> list[str]:
    counts: dict[str, int] = {}
    for text in texts:
        for w in _WORD_RE.findall(text):
            w = w.lower()
            counts[w] = counts.get(w, 0) + 1
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]


def sentences(texts: list[str], min_words: int = 5, max_words: int = 25) -> list[str]:
    out = []
    for text in texts:
        for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            n = len(s.split())
            if min_words <= n <= max_words and s[0].isupper() and s.endswith(".") and "http" not in s:
                out.append(s)
    return sorted(set(out))


class _Gen:
    def __init__(self, rng: random.Random, vocab: list[str], sents: list[str]) -> None:
        self.rng, self.vocab, self.sents = rng, vocab, sents

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(self.vocab) for _ in range(n))

    def name(self) -> str:
        return self.rng.choice(self.vocab).capitalize() + " " + self.rng.choice(self.vocab).capitalize()

    def num(self) -> str:
        return str(self.rng.choice([self.rng.randint(0, 999), round(self.rng.uniform(0, 100), 2)]))

    # keep: what the detector must not kill
    def md_table(self) -> str:
        cols = self.rng.randint(3, 7)
        head = "| " + " | ".join(self.rng.choice(self.vocab).capitalize() for _ in range(cols)) + " |\n"
        rows = "".join("| " + self.name() + " | " + " | ".join(self.num() for _ in range(cols - 1)) + " |\n"
                       for _ in range(self.rng.randint(30, 200)))
        return "Here is the table:\n\n" + head + "|" + "---|" * cols + "\n" + rows

    def feature_matrix(self) -> str:
        cols = self.rng.randint(4, 8)
        head = "| Feature | " + " | ".join(f"v{k}" for k in range(cols)) + " |\n|" + "---|" * (cols + 1) + "\n"
        rows = "".join("| " + self.words(self.rng.randint(1, 3)) + " | "
                       + " | ".join(self.rng.choice(["✓", "✗"]) for _ in range(cols)) + " |\n"
                       for _ in range(self.rng.randint(20, 80)))
        return head + rows

    def numbered_list(self) -> str:
        items = self.rng.sample(self.sents, self.rng.randint(20, 120))
        return "".join(f"{k}. {s}\n" for k, s in enumerate(items, 1))

    def csv(self) -> str:
        country, status = self.rng.choice(["US", "DE", "FR"]), self.rng.choice(["active", "ok"])
        rows = [f"2024-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d},{country},{status},"
                f"{self.rng.randint(0, 9999)},{self.rng.uniform(0, 1):.4f},{self.rng.choice(self.vocab)}"
                for _ in range(self.rng.randint(50, 500))]
        return "date,country,status,count,ratio,tag\n" + "\n".join(rows) + "\n"

    def math(self) -> str:
        a, d, n = self.rng.randint(1, 20), self.rng.randint(1, 9), self.rng.randint(20, 120)
        lines, total = [f"We add the terms of the arithmetic sequence a_k = {a} + {d}(k - 1) one by one.\n"], 0
        for k in range(1, n + 1):
            term = a + d * (k - 1)
            lines.append(f"S_{k} = S_{k - 1} + a_{k} = {total} + {term} = {total + term}\n")
            total += term
        x = self.rng.randint(2, 9)
        lines.append(f"\nCheck with the formula: S_n = n(2a + (n - 1)d)/2 = {n}(2*{a} + {n - 1}*{d})/2 = {total}.\n")
        lines += [f"(x + {k})^2 = x^2 + {2 * k}x + {k * k}; at x = {x}: {(x + k) ** 2}\n" for k in range(1, n // 2)]
        return "".join(lines)

    def code_blocks(self) -> str:
        out = ["import pytest\n\n"]
        for _ in range(self.rng.randint(8, 40)):
            fn, arg, val = self.rng.choice(self.vocab), self.rng.choice(self.vocab), self.rng.randint(0, 999)
            out.append(f"def test_{fn}_{arg}():\n    result = parse_{fn}({arg!r}, limit={val})\n"
                       f"    assert result.{arg} == {self.rng.randint(0, 99)}\n    assert result.ok\n\n\n")
        return "".join(out)

    def json_array(self) -> str:
        objs = [f'  {{"id": {k}, "name": "{self.name()}", "score": {self.rng.uniform(0, 100):.1f}, '
                f'"tags": ["{self.rng.choice(self.vocab)}", "{self.rng.choice(self.vocab)}"], "active": '
                f'{self.rng.choice(["true", "false"])}}}' for k in range(self.rng.randint(20, 200))]
        return "[\n" + ",\n".join(objs) + "\n]\n"

    # may_kill: repetition that a reader would call a loop, though a prompt could ask for it
    def identical_rows(self) -> str:
        row = "| " + " | ".join(self.rng.choice(self.vocab) for _ in range(4)) + " |\n"
        return "| a | b | c | d |\n|---|---|---|---|\n" + row * self.rng.randint(40, 200)

    def identical_json(self) -> str:
        obj = f'  {{"name": "{self.name()}", "value": {self.num()}}}'
        return "[\n" + ",\n".join([obj] * self.rng.randint(40, 200)) + "\n]\n"

    def zero_matrix(self) -> str:
        n = self.rng.randint(16, 40)
        return "[\n" + ",\n".join("  [" + ", ".join("1" if i == j else "0" for j in range(n)) + "]"
                                  for i in range(n)) + "\n]\n"

    def repeated_code(self) -> str:
        block = f"    {self.rng.choice(self.vocab)}.append({self.rng.choice(self.vocab)}({self.rng.randint(0, 9)}))\n"
        return "def build():\n" + block * self.rng.randint(40, 200)


KEEP = ("md_table", "feature_matrix", "numbered_list", "csv", "math", "code_blocks", "json_array")
MAY_KILL = ("identical_rows", "identical_json", "zero_matrix", "repeated_code")


def legit_repetitive(seed: int, per_kind: int, natural: list[str]) -> list[Turn]:
    rng = random.Random(seed)
    gen = _Gen(rng, vocabulary(natural), sentences(natural))
    out = []
    for label, kinds in (("keep", KEEP), ("may_kill", MAY_KILL)):
        for kind in kinds:
            make: Callable[[], str] = getattr(gen, kind)
            out += [Turn(f"{kind}#{k}", make(), label) for k in range(per_kind)]
    return out


# -- synthetic loops ----------------------------------------------------------------------------
LOOP_KINDS = ("word", "phrase", "paragraph", "counting_list", "thinking", "code_block", "symbols", "whitespace")
_CONNECTIVES = ("Wait, let me re-check.", "Hmm, let me verify this again.", "Actually, let me double-check.",
                "Let me re-check this step.", "Wait.", "But wait, let me make sure.")


def _loop_text(kind: str, gen: _Gen, code: list[str], min_chars: int) -> str:
    rng = gen.rng
    parts: list[str] = []
    size = 0

    def add(s: str) -> None:
        nonlocal size
        parts.append(s)
        size += len(s)

    if kind == "word":
        w = rng.choice(gen.vocab)
        add(w.capitalize())
        while size < min_chars:
            add(" " + w)
    elif kind == "phrase":
        s = rng.choice(gen.sents)
        while size < min_chars:
            add(s + " ")
    elif kind == "paragraph":
        para = " ".join(rng.sample(gen.sents, rng.randint(2, 14)))
        while size < min_chars:
            add(para + "\n\n")
    elif kind == "counting_list":
        item, k = rng.choice(gen.sents), rng.randint(1, 40)
        fmt = rng.choice(["{k}. {s}\n", "{k}) {s}\n", "- Step {k}: {s}\n", "**{k}.** {s}\n"])
        while size < min_chars:
            add(fmt.format(k=k, s=item))
            k += 1
    elif kind == "thinking":
        x, a, b = rng.randint(2, 30), rng.randint(2, 9), rng.randint(1, 50)
        step = (f" If x = {x}, then {a}x + {b} = {a * x + b}. That matches the equation, so x = {x} works."
                f" {rng.choice(gen.sents)} So the answer is {x}.\n\n")
        while size < min_chars:
            add(rng.choice(_CONNECTIVES) + (" Yes." if rng.random() < 0.2 else "") + step)
    elif kind == "code_block":
        start = rng.randrange(max(1, len(code) - 6))
        block = "".join(code[start:start + rng.randint(1, 6)]) or "x += 1\n"
        while size < min_chars:
            add(block)
    elif kind == "symbols":
        unit = rng.choice(["=", "-", "!", "*", ".", "ha", "...", "ab", "$$", "0"])
        while size < min_chars:
            add(unit)
    elif kind == "whitespace":
        unit = rng.choice(["\n", " ", "\n\n", " \n", "\t"])
        while size < min_chars:
            add(unit)
    else:
        raise ValueError(kind)
    return "".join(parts)


def synthetic_loops(seed: int, per_kind: int, natural: list[str], code: list[str],
                    loop_chars: int = 32_768) -> list[LoopCase]:
    """For each kind: natural text (0-8,000 chars, cut at a word end) then the loop, `loop_chars`
    long (8,192 tokens at 4 characters a token: the cap the loop would run to)."""
    rng = random.Random(seed)
    gen = _Gen(rng, vocabulary(natural), sentences(natural))
    code_lines = [ln + "\n" for text in code for ln in text.splitlines() if ln.strip()]
    out = []
    for kind in LOOP_KINDS:
        for _ in range(per_kind):
            source = rng.choice(natural)
            cut = source.rfind(" ", 0, rng.randint(0, min(8000, len(source))))
            prefix = source[: max(cut, 0)].rstrip() if cut > 0 else ""
            prefix = prefix + ("\n\n" if prefix and kind != "word" else " " if prefix else "")
            out.append(LoopCase(kind, prefix + _loop_text(kind, gen, code_lines, loop_chars), len(prefix)))
    return out
