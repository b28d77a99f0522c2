"""Token ids of many texts, exactly `tokenizer(text, add_special_tokens=False)["input_ids"]` of each, fast: from the
ids of the text's chunks, each distinct chunk tokenized once, where the tokenizer provably tokenizes the chunks of a
text independently; else from the whole text (a fast tokenizer spends most of its time on per-word bookkeeping, and
most chunks recur: docs/measurements.md). A text is cut before every ' ' that follows printable ASCII ([!-~]). Its
ids are its chunks' ids in order when (checked in `additive_config`):
  - no added token contains ' ' or strips/matches whole words: none spans a cut;
  - the normalizer is none or NFC: ' ' combines with nothing before it, so NFC(a + b) = NFC(a) + NFC(b);
  - the pre-tokenizer is byte-level without a prefix space, splitting with the GPT-2 regex (ByteLevel use_regex) or
    a regex of SPLIT_REGEXES (Split, then ByteLevel without its regex): no alternative matches a non-space character
    followed by ' ', none looks behind, and the one lookahead, `\\s+(?!\\S)`, cannot end at a cut (the character
    before it is not whitespace);
  - the model works on each pre-token alone (BPE without dropout).
A chunk of up to 15 bytes is known by its bytes and length packed in two 64-bit words (exact, no hash to collide); a
longer one by its bytes in a dict."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

ID_DTYPE = np.int32
Ids = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]  # (the texts' ids end to end, int32; starts, n + 1)
SPLIT_REGEXES = {  # the Split patterns of byte-level tokenizers whose cuts are proven above
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
             r"\s+(?!\S)|\s+",
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+",
}
GROUP_BYTES = 1 << 20  # text looked up at once (numpy's passes stay in cache)
SLOT_BITS = 20  # the table of short chunks: 2**20 slots, one probe; a taken slot sends a chunk to a dict
MAX_CHUNKS = 4_000_000  # distinct chunks kept (then the table starts again): bounds memory on any text
_U64 = np.dtype("<u8")  # the packing reads bytes little-endian on any machine
_MASK_LO = np.array([(1 << 8 * min(n, 8)) - 1 for n in range(16)], dtype=np.uint64)
_MASK_HI = np.array([(1 << 8 * max(0, n - 8)) - 1 for n in range(16)], dtype=np.uint64)
_MIX_LO, _MIX_HI = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def _state(component: Any) -> Any:
    """A tokenizers component (normalizer, pre-tokenizer) as its tokenizer.json dict, None if absent."""
    import orjson

    return None if component is None else orjson.loads(component.__getstate__())


def additive_config(tokenizer: Any) -> str:
    """'' when the chunks of a text tokenize independently with this tokenizer (the module docstring),
    else why not (the texts are then tokenized whole)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "not a fast (tokenizers) tokenizer"
    if backend.truncation is not None or backend.padding is not None:
        return "its backend truncates or pads"
    if getattr(backend, "encode_special_tokens", False):
        return "it encodes special tokens as text"
    for tok in backend.get_added_tokens_decoder().values():
        if " " in tok.content or tok.lstrip or tok.rstrip or tok.single_word:
            return f"added token {tok.content!r} holds a space or strips/matches whole words"
    normalizer = _state(backend.normalizer)
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"normalizer {normalizer.get('type')}"
    model = type(backend.model).__name__
    if model != "BPE" or getattr(backend.model, "dropout", None):
        return f"model {model}" + (" with dropout" if model == "BPE" else "")
    pre = _state(backend.pre_tokenizer)
    if _byte_level(pre, regex=True):
        return ""
    if (isinstance(pre, dict) and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 2
            and _byte_level(pre["pretokenizers"][1], regex=False)):
        split = pre["pretokenizers"][0]
        if (split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert")
                and (split.get("pattern") or {}).get("Regex") in SPLIT_REGEXES.values()):
            return ""
    return "a pre-tokenizer whose splits are not known here"


def _byte_level(pre: Any, *, regex: bool) -> bool:
    return (isinstance(pre, dict) and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space")
            and bool(pre.get("use_regex", True)) == regex)


def _ends(lengths: Any) -> np.ndarray[Any, Any]:
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


class TextEncoder:
    """Token ids of texts: `encode(texts)` → (ids end to end, starts), text i's ids being
    ids[starts[i]:starts[i + 1]]."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        tokenizer("", add_special_tokens=False)  # the call sets the backend's state (truncation, specials)
        self.why_whole = additive_config(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.backend = backend if backend is not None and not self.why_whole.startswith("its backend") else None
        self.stats: Counter[str] = Counter()
        self._table = _Chunks()

    @property
    def chunked(self) -> bool:
        return not self.why_whole

    def whole(self, why: str) -> None:
        """Tokenize whole texts from now on (`why` says why)."""
        self.why_whole = why or "asked"

    def encode(self, texts: list[str]) -> Ids:
        if not self.chunked:
            self.stats["texts_whole"] += len(texts)
            return self.encode_whole(texts)
        self.stats["texts_chunked"] += len(texts)
        if self._table.size > MAX_CHUNKS:
            self._table = _Chunks()
        parts: list[Ids] = []
        group: list[bytes] = []
        size = 0
        for t in texts:
            group.append(t.encode())
            size += len(group[-1])
            if size >= GROUP_BYTES:
                parts.append(self._encode_group(group))
                group, size = [], 0
        if group or not parts:
            parts.append(self._encode_group(group))
        if len(parts) == 1:
            return parts[0]
        ids = np.concatenate([p[0] for p in parts])
        offsets = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
        return ids, np.concatenate([p[1][:-1] + o for p, o in zip(parts, offsets, strict=True)] + [[len(ids)]])

    def encode_whole(self, texts: list[str]) -> Ids:
        """The ids of each text from the tokenizer on the whole text (its backend where that is the same)."""
        if self.backend is not None and texts:
            encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            ids = [e.ids for e in encode(texts, add_special_tokens=False)]
        else:
            ids = list(self.tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else []
        starts = _ends([len(i) for i in ids])
        flat = np.concatenate([np.asarray(i, dtype=ID_DTYPE) for i in ids]) if ids else np.zeros(0, ID_DTYPE)
        return flat.astype(ID_DTYPE, copy=False), starts

    def _encode_group(self, encoded: list[bytes]) -> Ids:
        """The ids of texts given as UTF-8, from the chunk table (new chunks tokenized first)."""
        starts = _ends([len(b) for b in encoded])
        n = int(starts[-1])
        buf = b"".join(encoded) + bytes(16)  # the packing reads up to 15 bytes past a chunk's start
        data = np.frombuffer(buf, dtype=np.uint8)
        cut = np.zeros(n, dtype=bool)
        if n > 1:
            before, at = data[:n - 1], data[1:n]
            cut[1:] = (at == 0x20) & (before >= 0x21) & (before <= 0x7E)
        firsts = starts[:-1][starts[:-1] < starts[1:]]
        cut[firsts] = True  # every (non-empty) text starts a chunk
        chunk = np.flatnonzero(cut)
        length = np.diff(chunk, append=n)
        words = np.ndarray(shape=(n + 8,), dtype=_U64, buffer=buf, strides=(1,))  # 8 bytes from every position
        short = length <= 15
        clipped = np.minimum(length, 15)
        lo = words[chunk] & _MASK_LO[clipped]
        hi = (words[chunk + 8] & _MASK_HI[clipped]) | (clipped.astype(np.uint64) << np.uint64(56))
        table = self._table
        entry = table.find(lo, hi, short, chunk, length, buf)
        missing = np.flatnonzero(entry < 0)
        if len(missing):  # tokenize each new chunk once (one occurrence of each), then look again
            short_missing, long_missing = missing[short[missing]], missing[~short[missing]]
            packed = np.stack([lo[short_missing], hi[short_missing]], axis=1).view("V16").ravel()
            new_short = short_missing[np.unique(packed, return_index=True)[1]]
            new_long = list(dict.fromkeys(buf[s:s + k] for s, k in zip(chunk[long_missing].tolist(),
                                                                          length[long_missing].tolist(), strict=True)))
            texts = [buf[s:s + k].decode() for s, k in zip(chunk[new_short].tolist(), length[new_short].tolist(),
                                                             strict=True)]
            texts += [b.decode() for b in new_long]
            self.stats["chunks_tokenized"] += len(texts)
            table.add(lo[new_short], hi[new_short], new_long, self.encode_whole(texts))
            entry[missing] = table.find(lo[missing], hi[missing], short[missing], chunk[missing], length[missing], buf)
            if (entry < 0).any():
                raise RuntimeError("a chunk tokenized just now is not in the chunk table")
        return table.ids(entry, np.searchsorted(chunk, starts))


class _Chunks:
    """The distinct chunks met so far, and their token ids end to end."""

    def __init__(self) -> None:
        slots = 1 << SLOT_BITS
        self.slot_lo = np.zeros(slots, dtype=np.uint64)
        self.slot_hi = np.zeros(slots, dtype=np.uint64)
        self.slot_entry = np.full(slots, -1, dtype=np.int64)
        self.packed: dict[tuple[int, int], int] = {}  # short chunks whose slot was taken
        self.long: dict[bytes, int] = {}  # chunks over 15 bytes
        self.tokens = np.zeros(1 << 16, dtype=ID_DTYPE)  # the ids of every chunk, end to end (capacity)
        self.token_start = np.zeros(1 << 12, dtype=np.int64)
        self.token_count = np.zeros(1 << 12, dtype=np.int64)
        self.size = 0
        self.used = 0

    @staticmethod
    def _slot(lo: Any, hi: Any) -> Any:
        return (((lo * _MIX_LO) ^ (hi * _MIX_HI)) >> np.uint64(64 - SLOT_BITS)).astype(np.int64)

    def find(self, lo: Any, hi: Any, short: Any, chunk: Any, length: Any, buf: bytes) -> np.ndarray[Any, Any]:
        """The entry of each chunk, -1 where unknown."""
        slot = self._slot(lo, hi)
        entry: np.ndarray[Any, Any] = self.slot_entry[slot]
        entry[~((self.slot_lo[slot] == lo) & (self.slot_hi[slot] == hi) & short)] = -1
        unknown = np.flatnonzero(entry < 0)
        if self.packed:
            for i in unknown[short[unknown]].tolist():
                entry[i] = self.packed.get((int(lo[i]), int(hi[i])), -1)
        if self.long:
            for i in unknown[~short[unknown]].tolist():
                entry[i] = self.long.get(buf[chunk[i]:chunk[i] + length[i]], -1)
        return entry

    def add(self, lo: Any, hi: Any, long: list[bytes], ids: Ids) -> None:
        """New chunks: short ones by their packed words, then long ones; `ids` theirs in that order."""
        flat, starts = ids
        n = len(lo) + len(long)
        self._grow(self.size + n, self.used + len(flat))
        self.tokens[self.used:self.used + len(flat)] = flat
        self.token_start[self.size:self.size + n] = starts[:-1] + self.used
        self.token_count[self.size:self.size + n] = np.diff(starts)
        entries = np.arange(self.size, self.size + len(lo))
        self.long.update(zip(long, range(self.size + len(lo), self.size + n), strict=True))
        self.used += len(flat)
        self.size += n
        slot = self._slot(lo, hi)
        free = self.slot_entry[slot] < 0
        _, first = np.unique(slot[free], return_index=True)  # one new chunk a free slot
        take = np.flatnonzero(free)[first]
        at = slot[take]
        self.slot_lo[at], self.slot_hi[at], self.slot_entry[at] = lo[take], hi[take], entries[take]
        rest = np.ones(len(lo), dtype=bool)
        rest[take] = False
        for i in np.flatnonzero(rest).tolist():
            self.packed[(int(lo[i]), int(hi[i]))] = int(entries[i])

    def _grow(self, size: int, used: int) -> None:
        if size > len(self.token_start):
            n = max(size, 2 * len(self.token_start))
            self.token_start = np.resize(self.token_start, n)
            self.token_count = np.resize(self.token_count, n)
        if used > len(self.tokens):
            self.tokens = np.resize(self.tokens, max(used, 2 * len(self.tokens)))

    def ids(self, entry: Any, text_chunk: Any) -> Ids:
        """The ids of chunks `entry` end to end, and where each text starts (`text_chunk`: the
        index of each text's first chunk, and the number of chunks last)."""
        count = self.token_count[entry]
        ends = _ends(count)
        total = int(ends[-1])
        take = count > 0
        start, count, at = self.token_start[entry[take]], count[take], ends[:-1][take]
        index = np.ones(total, dtype=np.int64)  # start, start+1, … of every chunk: a cumsum of steps
        if total:
            index[0] = start[0]
            index[at[1:]] = start[1:] - (start[:-1] + count[:-1] - 1)
            np.cumsum(index, out=index)
        return self.tokens[index], ends[text_chunk]
