"""Lucene-compatible English analysis, as Anserini's ``DefaultEnglishAnalyzer`` does it.

The chain (Lucene 9.9.1, the analyzer Pyserini uses for BEIR "flat" BM25):

    StandardTokenizer (UAX#29 word breaks, max token length 255)
    -> EnglishPossessiveFilter ('s, 'S, ’s, ＇s removed)
    -> LowerCaseFilter (per code point, Java's Character.toLowerCase)
    -> StopFilter (Lucene's 33 English stopwords)
    -> PorterStemFilter (Porter's reference C version; see ``porter.py``)

UAX#29 word segmentation comes from the ``regex`` module's ``(?w)`` default-word-boundary
mode. StandardTokenizer emits a segment only when it holds a letter, digit, ideograph,
kana, Hangul or emoji; punctuation-only segments are dropped. The Porter step is
``porter.porter_stem`` (Lucene's variant, not Snowball's); each distinct token is stemmed
once (a bounded dict cache).

Parity is checked against Lucene's own term vectors of every SciFact and NFCorpus document
(``tests/test_analysis_lucene.py``), not only against hand-picked cases.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass

import regex

from .porter import porter_stem

#: Lucene's ``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`` (33 words).
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the "
    "their then there these they this to was will with".split()
)

#: StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH: longer tokens are split into 255-char pieces.
MAX_TOKEN_LENGTH = 255

# A UAX#29 segment that starts with a word character (letters, digits, marks, connector
# punctuation, ideographs, kana) or an emoji/pictograph (Lucene emits © and ® as tokens),
# up to the next default word boundary.
# The regex module glues a leading apostrophe (or other mid-word punctuation) to the word
# after it ("'other" stays one segment), where UAX#29 breaks: the group skips it.
_SEGMENT = regex.compile(
    r"(?wV1)\b[\p{WB=MidNumLet}\p{WB=Single_Quote}\p{WB=MidLetter}\p{WB=MidNum}]*"
    r"((?:\w|\p{Emoji_Presentation}|\p{Extended_Pictographic}|\p{Regional_Indicator}).*?)\b",
    regex.DOTALL,
)
# A run of mid-word punctuation (MidLetter, MidNum, MidNumLet, Single_Quote) longer than two
# characters: the segment regex tries every start inside such a run and scans to its end
# from each, so a 40,000-character word of middle dots took 24 s. Two or more of them in a
# row never join letters (WB6/WB7 and WB11/WB12 need a letter or digit on both sides of one
# such character), so the run's first two characters segment the text exactly as the whole
# run does, and the tokens are the same.
# (Extend, Format and ZWJ characters attach to the character before them, WB4, so each
# punctuation character of the run brings those that follow it.)
_MID_UNIT = r"[\p{WB=MidNumLet}\p{WB=Single_Quote}\p{WB=MidLetter}\p{WB=MidNum}]"
_MID_RUN = regex.compile(rf"((?:{_MID_UNIT}){{2}})(?:{_MID_UNIT})+")
#: Words at most this long are segmented as they are (a run inside them costs little).
_MID_RUN_MIN_WORD = 64
# StandardTokenizer emits no token for a run of connector punctuation alone ("___").
_CONNECTOR_ONLY = regex.compile(r"[\p{WB=ExtendNumLet}\p{WB=Extend}\p{WB=Format}]+")
# Where splitting at whitespace could cut differently from segmenting the whole text: an
# Extend/Format/ZWJ character next to whitespace (WB4 attaches it to the character before
# it; at the start of a word it would be a segment of its own, and the regex module glues a
# ZWJ to the whitespace after it).
# "Whitespace" is what str.split() splits at (str.isspace: \x1c-\x1f too, unlike \s here).
_SPLIT_AT = "[" + "".join(f"\\u{c:04x}" for c in range(0x3001) if chr(c).isspace()) + "]"
_GLUED_TO_SPACE = regex.compile(f"{_SPLIT_AT}[\\p{{WB=Extend}}\\p{{WB=Format}}\\p{{WB=ZWJ}}]"
                                f"|[\\p{{WB=Extend}}\\p{{WB=Format}}\\p{{WB=ZWJ}}]{_SPLIT_AT}")
_POSSESSIVE_ENDINGS = ("'s", "'S", "\u2019s", "\u2019S", "\uff07s", "\uff07S")
# Java's Character.toLowerCase maps each code point to one code point; Python's str.lower
# maps U+0130 to two and lowercases a word-final capital sigma to ς. Fix those up.
_JAVA_LOWER_EXCEPTIONS = {"\u0130": "i"}

ANALYZER_NAME = "lucene-english"
ANALYZER_VERSION = 1  # bump on any change that alters the token stream

# Probe text for the behavioural fingerprint: if a library upgrade changes what the
# analyzer produces on these, the fingerprint changes and serving refuses the index.
_FINGERPRINT_PROBE = (
    "John's O'Neill don't COVID-19 SARS-CoV-2 state-of-the-art 3.14 1,000 v2.0.1 U.S.A. "
    "john.doe@example.com https://www.example.com/path?q=1 naïve café ΣΑΣ İstanbul ß-catenin "
    "日本語のテキスト emoji 😀 generalizations studies relational happiness running a the"
)


def _java_lower(token: str) -> str:
    if token.isascii():
        return token.lower()
    out = []
    for ch in token:
        low = _JAVA_LOWER_EXCEPTIONS.get(ch)
        if low is None:
            low = ch.lower()
            if len(low) != 1:
                low = ch
        out.append(low)
    return "".join(out)


def _segment_tokens(seg: str) -> list[str]:
    """The lowercased tokens of one UAX#29 segment: none (connector punctuation only), one, or
    several (a segment over ``MAX_TOKEN_LENGTH`` is cut into pieces), possessives removed."""
    if not seg[0].isalnum() and _CONNECTOR_ONLY.fullmatch(seg):
        return []
    pieces = (
        [seg] if len(seg) <= MAX_TOKEN_LENGTH
        else [seg[i:i + MAX_TOKEN_LENGTH] for i in range(0, len(seg), MAX_TOKEN_LENGTH)]
    )
    tokens = []
    for tok in pieces:
        if tok.endswith(_POSSESSIVE_ENDINGS):
            tok = tok[:-2]
            if not tok:
                continue
        tokens.append(_java_lower(tok))
    return tokens


def tokenize_raw(text: str) -> list[str]:
    """StandardTokenizer + EnglishPossessiveFilter + LowerCaseFilter (no stop, no stem)."""
    tokens: list[str] = []
    for seg in _SEGMENT.findall(text):
        tokens.extend(_segment_tokens(seg))
    return tokens


@dataclass(frozen=True)
class AnalyzerConfig:
    """What the analyzer does; stored in the manifest beside the fingerprint."""

    stopwords: bool = True
    stemmer: str = "porter"  # "porter" or "none"

    def to_dict(self) -> dict:
        return {"name": ANALYZER_NAME, "version": ANALYZER_VERSION,
                "stopwords": self.stopwords, "stemmer": self.stemmer}


#: Distinct words whose analysis an `Analyzer` remembers (~100 bytes each).
WORD_CACHE_SIZE = 1_000_000


class Analyzer:
    """Lucene English analysis. Not thread-safe only in its caches (benign races).

    Each distinct whitespace-separated word of the text is analyzed once (UAX#29 segments,
    lowercased, possessives removed, stopwords dropped, stemmed) and its terms remembered,
    so a repeated word costs one dict lookup. This equals segmenting the whole text because
    UAX#29 breaks on both sides of every whitespace character, except where WB4 glues an
    Extend/Format/ZWJ character to it: a text with one next to whitespace takes the whole-text path
    (1 SciFact document of 5,183). Both paths are checked against Lucene's term vectors of
    every SciFact and NFCorpus document, and against each other on generated text.
    """

    def __init__(self, config: AnalyzerConfig | None = None):
        self.config = config or AnalyzerConfig()
        if self.config.stemmer not in ("porter", "none"):
            raise ValueError(
                f"unknown stemmer {self.config.stemmer!r}; choose one of porter, none")
        self._stopwords = LUCENE_ENGLISH_STOPWORDS if self.config.stopwords else frozenset()
        self._stemmer = porter_stem if self.config.stemmer == "porter" else None
        # word -> its terms: "" for none, the term for one, a tuple for several
        self._words: dict[str, str | tuple[str, ...]] = {}
        # token -> its stem: distinct words share tokens ("cell," "cell." "cells"), so a
        # token is stemmed once (SciFact: 122K tokens of 96K distinct words, 38K distinct)
        self._stems: dict[str, str] = {}

    def _stem(self, token: str) -> str:
        got = self._stems.get(token)
        if got is None:
            got = self._stemmer(token)
            if len(self._stems) < WORD_CACHE_SIZE:
                self._stems[token] = got
        return got

    def _analyze_word(self, text: str) -> str | tuple[str, ...]:
        stem, stop = (self._stem if self._stemmer is not None else None), self._stopwords
        # An ASCII letters-and-digits word is one UAX#29 segment (WB5, WB8-WB10): no regex.
        if text.isascii() and text.isalnum():
            segs = (text,)
        else:
            segs = _SEGMENT.findall(_MID_RUN.sub(r"\1", text) if len(text) > _MID_RUN_MIN_WORD else text)
        terms = [stem(t) if stem is not None else t for seg in segs for t in _segment_tokens(seg) if t not in stop]
        return (terms[0] if terms else "") if len(terms) < 2 else tuple(terms)

    def split_words(self, text: str) -> list[str] | None:
        """The whitespace-separated words `analyze` analyzes one at a time (its
        stream is their `word_terms` in order), or None where it analyzes the text
        whole (a non-ASCII text with a character that UAX#29 glues to whitespace)."""
        if not text.isascii() and _GLUED_TO_SPACE.search(text):
            return None
        return text.split()

    def word_terms(self, word: str) -> tuple[str, ...]:
        """The terms of one word of `split_words`, as `analyze` emits them."""
        got = self._words.get(word)
        if got is None:
            got = self._analyze_word(word)
            if len(self._words) < WORD_CACHE_SIZE:
                self._words[word] = got
        if got.__class__ is str:
            return (got,) if got else ()
        return got

    def analyze(self, text: str) -> list[str]:
        """The token stream Lucene would index for ``text``."""
        if not text.isascii() and _GLUED_TO_SPACE.search(text):
            got = self._analyze_word(text)
            return list(got) if isinstance(got, tuple) else [got] if got else []
        cache, out = self._words, []
        append = out.append
        for word in text.split():
            got = cache.get(word)
            if got is None:
                got = self._analyze_word(word)
                if len(cache) < WORD_CACHE_SIZE:
                    cache[word] = got
            if got.__class__ is str:
                if got:
                    append(got)
            else:
                out.extend(got)
        return out

    def term_counts(self, text: str) -> Counter:
        return Counter(self.analyze(text))

    def fingerprint(self) -> str:
        """sha256 over the configuration and the token stream of a fixed probe text."""
        payload = json.dumps(
            {"config": self.config.to_dict(), "probe": self.analyze(_FINGERPRINT_PROBE)},
            ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]

    def describe(self) -> dict:
        return {**self.config.to_dict(), "fingerprint": self.fingerprint()}
