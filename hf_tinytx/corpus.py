# Copyright 2026 The hf_tinytx authors. Licensed under the Apache License, Version 2.0.
"""The built-in training corpus: English-like text whose next words can only be predicted by looking back.

* ``coref`` (Winograd-style): "The animal didn't cross the street because it was too tired. The animal was too
  tired." Only resolving "it" predicts the noun after "The".
* ``recall``: facts stated early ("The code for the blue door is 4 7 1."),
  filler, then the fact's opening again.
* ``copy``: "Repeat: w1 w2 ... wk. Again: w1 w2 ... wk.", with filler between the two.

Each stream draws from its own ``random.Random`` seeded with a string
(``"hf_tinytx.corpus/documents/{seed}"``): the same text on every machine. ``coref_new_nouns`` probes use
:data:`HELD_OUT_NOUNS`, which no document contains.
"""

import math
import random
from dataclasses import dataclass


KINDS = ("coref", "recall", "copy")
PROBE_KINDS = ("coref", "coref_new_nouns", "recall", "copy")


@dataclass(frozen=True)
class Mix:
    """How documents are drawn. `Mix()` draws the kinds alike, with only real nouns."""

    kind_weights: tuple[float, ...] | None = None  # odds of coref, recall, copy; None: uniform
    made_up_share: float = 0.0  # of coreference statements whose two nouns are both made up
    copy_max_gap: int | None = None  # caps the filler inside copy documents; None: the recall cap (200 words)
    # Of made-up pairs, those that begin alike ("blick", "blomp"): the noun is
    # chosen again at its second piece.
    shared_onset_share: float = 0.0

    def weights(self, kinds: tuple[str, ...]) -> list[float] | None:
        return None if self.kind_weights is None else [self.kind_weights[KINDS.index(kind)] for kind in kinds]


# `tinytx pretrain`'s corpus: mostly coreference with made-up nouns (the rule, not the nouns, is
# learnt), and short copy documents so that copying is learnt in the same run. Why:
# docs/results.md ("The default run's corpus ...").
DEFAULT_MIX = Mix(kind_weights=(6, 2, 4), made_up_share=0.75, copy_max_gap=10, shared_onset_share=0.5)
# Claim 4's corpus (`python -m benchmarks.seed_claims`): coreference only, the real quarter keeping
# the frames' own nouns in the vocabulary. Why: docs/results.md (`python -m
# benchmarks.seed_claims.rule_ablation`).
RULE_MIX = Mix(kind_weights=(1, 0, 0), made_up_share=0.75)


@dataclass(frozen=True)
class Probe:
    """One multiple-choice question for a language model: which continuation of `prompt` is most likely?"""

    kind: str  # "coref" | "coref_new_nouns" | "recall" | "copy"
    prompt: str  # text up to (not including) the answer, e.g. "... because it was too tired. The"
    answer: str  # the correct continuation, with its leading space, e.g. " animal"
    distractors: tuple[str, ...]  # wrong continuations of the same form, e.g. (" street",)
    # words between the fact and the question (recall), the list and its repetition (copy); 0: coref
    distance: int


# ---- Coreference


@dataclass(frozen=True)
class CorefTemplate:
    """One sentence frame with two nouns, `a` and `b`. `a_adjectives` make "it" mean
    `a`, `b_adjectives` mean `b`."""

    sentence: str  # uses {a}, {b} and {adjective}
    a_nouns: tuple[str, ...]
    a_adjectives: tuple[str, ...]
    b_nouns: tuple[str, ...]
    b_adjectives: tuple[str, ...]
    held_out_a_nouns: tuple[str, ...]  # only ever used by "coref_new_nouns" probes
    held_out_b_nouns: tuple[str, ...]


# Each frame, then for nouns `a` and `b`: nouns | adjectives that make "it" mean that noun | held-out nouns.
_FRAMES = """
The {a} didn't cross the {b} because it was too {adjective}.
    a: animal dog horse cow goat sheep cat child | tired scared weak sleepy slow | fox mule donkey lamb
    b: street road river bridge field track | wide busy long muddy dangerous | canal meadow creek pasture
The {a} would not fit in the {b} because it was too {adjective}.
    a: bandage book ball trophy lamp coat shoe bottle | large big tall thick | kettle helmet blanket trumpet
    b: case box bag drawer suitcase basket | small narrow tiny full shallow | crate locker pouch barrel
The {a} could not cut the {b} because it was too {adjective}.
    a: knife saw blade axe razor | dull blunt rusty short | sickle chisel dagger sword
    b: rope log wire branch bone cable | thick hard tough strong | plank cord twig chain
The {a} could not go through the {b} because it was too {adjective}.
    a: truck bus van cart car tractor | wide big tall long | wagon trailer lorry carriage
    b: tunnel gate door gap arch | narrow low small tight | doorway passage hallway alley
The {a} did not eat the {b} because it was too {adjective}.
    a: cat dog bird baby puppy rabbit | full sick sleepy shy | hamster parrot piglet toddler
    b: soup bread meat cake rice fish | hot cold salty dry spicy | porridge pudding pasta stew
"""


def _read_frames(table: str) -> tuple[CorefTemplate, ...]:
    lines = table.strip().splitlines()
    templates = []
    for sentence, a, b in zip(lines[0::3], lines[1::3], lines[2::3]):
        (a_nouns, a_adjectives, a_held), (b_nouns, b_adjectives, b_held) = (
            [tuple(part.split()) for part in role.split(":", 1)[1].split("|")] for role in (a, b))
        templates.append(
            CorefTemplate(sentence, a_nouns, a_adjectives, b_nouns, b_adjectives, a_held, b_held)
        )
    return tuple(templates)


COREF_TEMPLATES = _read_frames(_FRAMES)

HELD_OUT_NOUNS = frozenset(noun for template in COREF_TEMPLATES
                           for noun in template.held_out_a_nouns + template.held_out_b_nouns)


@dataclass(frozen=True)
class _CorefItem:
    statement: str  # "The animal didn't cross the street because it was too tired."
    referent: str  # "animal": what "it" means
    other: str  # "street"
    adjective: str

    def probe(self, kind: str) -> Probe:
        return Probe(kind, f"{self.statement} The", f" {self.referent}", (f" {self.other}",), distance=0)


# Made-up nouns ("blick", "tromp"): a real noun's class can give the answer away (animals get tired), a
# made-up one has none. English-like syllables, so that their tokenizer pieces also spell real words.
_ONSETS = (
    "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y", "z", "bl", "br",
    "ch", "cl", "cr", "dr", "fl", "gl", "gr", "pl", "pr", "sc", "sh", "sk", "sl", "sm", "sn", "sp", "st",
    "sw", "th", "tr", "wh",
)
_VOWELS = (
    "a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ea", "ee", "oa", "oo", "ou", "ow", "ay", "y",
)
_CODAS = (
    "", "", "", "b", "ck", "d", "dge", "ft", "g", "k", "l", "ll", "m", "mp", "n", "nd", "ng", "nk", "nt", "p",
    "r", "rd", "rk", "rn", "rt", "s", "sh", "sk", "st", "t", "tch", "th", "x",
)
_ENDINGS = ("", "", "", "", "", "le", "er", "et", "y", "on", "el", "ow", "ing", "age", "ish")


def _made_up_noun(rng: random.Random, onset: str = "") -> str:
    """A pronounceable non-word of one or two syllables, not in
    :data:`HELD_OUT_NOUNS`; `onset`: its first letters."""
    while True:
        syllables = "".join((onset if i == 0 and onset else rng.choice(_ONSETS)) + rng.choice(_VOWELS)
                            + rng.choice(_CODAS) for i in range(rng.choice((1, 1, 2))))
        noun = syllables + rng.choice(_ENDINGS)
        if 3 <= len(noun) <= 8 and noun not in HELD_OUT_NOUNS:
            return noun


def _onset(noun: str) -> str:
    return noun[:2] if noun[:2] in _ONSETS else noun[:1]


def _coref_item(rng: random.Random, held_out: bool = False, made_up_share: float = 0.0,
                shared_onset_share: float = 0.0) -> _CorefItem:
    """A statement with the frame's held-out nouns, its own nouns or
    (`made_up_share` of the time) made-up ones."""
    template = rng.choice(COREF_TEMPLATES)
    if held_out:
        a, b = rng.choice(template.held_out_a_nouns), rng.choice(template.held_out_b_nouns)
    elif made_up_share and rng.random() < made_up_share:  # no draw at 0: the default corpus stays as it was
        a = _made_up_noun(rng)
        onset = _onset(a) if shared_onset_share and rng.random() < shared_onset_share else ""
        b = _made_up_noun(rng, onset)
        while b == a:
            b = _made_up_noun(rng, onset)
    else:
        a, b = rng.choice(template.a_nouns), rng.choice(template.b_nouns)
    # A fair coin for which noun "it" means, so the first-named noun is never a free guess.
    if rng.random() < 0.5:
        referent, other, adjective = a, b, rng.choice(template.a_adjectives)
    else:
        referent, other, adjective = b, a, rng.choice(template.b_adjectives)
    statement = template.sentence.format(a=a, b=b, adjective=adjective)
    return _CorefItem(statement, referent, other, adjective)


def _coref_document(rng: random.Random, mix: Mix) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        item = _coref_item(rng, made_up_share=mix.made_up_share, shared_onset_share=mix.shared_onset_share)
        sentences += [item.statement, f"The {item.referent} was too {item.adjective}."]
    return " ".join(sentences)


# ---- Recall: facts, filler, question

NAMES = ("Mia", "Leo", "Ava", "Sam", "Noah", "Emma", "Omar", "Lily", "Jack", "Zoe",
         "Ravi", "Nina", "Ben", "Sara", "Tom", "Ana", "Ivan", "Maya", "Eli", "Rosa")
COLORS = (
    "red", "blue", "green", "yellow", "black", "white", "orange", "purple", "brown", "grey", "pink", "silver",
)
CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Delhi", "Rome", "Tokyo", "Dublin",
          "Quito", "Accra", "Madrid", "Berlin", "Vienna", "Prague", "Lisbon", "Nairobi")
MAX_FACTS_PER_DOCUMENT = 3
_RECALL_DISTRACTORS = 3


@dataclass(frozen=True)
class _Fact:
    """A fact sentence split where the question stops: `question + answer + ending` is the sentence."""

    kind: str  # "code" | "box" | "city": facts of one kind are each other's natural distractors
    question: str  # "The code for the blue door is"
    answer: str  # " 4 7 1"
    ending: str  # "."

    @property
    def sentence(self) -> str:
        return self.question + self.answer + self.ending


def _random_code(rng: random.Random) -> str:
    return " " + " ".join(str(rng.randrange(10)) for _ in range(3))


def _make_facts(rng: random.Random, count: int) -> list[_Fact]:
    """`count` facts whose keys (door colour, person) differ and whose values differ within a kind."""
    door_colors = rng.sample(COLORS, count)
    people = rng.sample(NAMES, count)
    box_colors = rng.sample(COLORS, count)
    cities = rng.sample(CITIES, count)
    codes: list[str] = []
    facts = []
    for i in range(count):
        kind = rng.choice(("code", "box", "city"))
        if kind == "code":
            code = _random_code(rng)
            while code in codes:
                code = _random_code(rng)
            codes.append(code)
            facts.append(_Fact("code", f"The code for the {door_colors[i]} door is", code, "."))
        elif kind == "box":
            facts.append(_Fact("box", f"{people[i]} keeps the key in the", f" {box_colors[i]}", " box."))
        else:
            facts.append(_Fact("city", f"{people[i]} was born in", f" {cities[i]}", "."))
    return facts


def _recall_distractors(rng: random.Random, fact: _Fact, others: list[_Fact]) -> tuple[str, ...]:
    """Wrong values of the same kind: first those the document states for other keys, then fresh ones."""
    chosen = [other.answer for other in others if other.kind == fact.kind][:_RECALL_DISTRACTORS]
    while len(chosen) < _RECALL_DISTRACTORS:
        if fact.kind == "code":
            candidate = _random_code(rng)
        else:
            candidate = " " + rng.choice(COLORS if fact.kind == "box" else CITIES)
        if candidate != fact.answer and candidate not in chosen:
            chosen.append(candidate)
    return tuple(chosen)


_FILLER_SUBJECTS = (
    "The farmer", "A teacher", "The old man", "Her neighbour", "The children", "A young woman", "The baker",
    "His sister", "The driver", "A tall stranger", "The students", "Our uncle",
)
_FILLER_VERBS = ("walked to", "looked at", "talked about", "waited near", "cleaned", "painted", "visited",
                 "sat beside", "thought about", "drew a picture of", "wrote a letter about", "sang about")
_FILLER_PLACES = (
    "the garden", "the market", "the old church", "the kitchen", "the quiet library", "the long hill",
    "the village square", "the school", "the small farm", "the harbour", "the museum", "the train station",
)
_FILLER_TAILS = ("", " in the morning", " after lunch", " before the rain", " for a while", " on Sunday",
                 " with a friend", " late at night", " once again")
_FILLER_SAYINGS = (
    "It was a quiet day.", "The sky was calm.", "Nothing else happened.", "The wind was cold that evening.",
    "Everyone was busy.", "The clock on the wall ticked slowly.", "A bell rang somewhere far away.",
    "Later the rain stopped.", "The streets were empty at dawn.", "Somebody laughed in the next room.",
    "The tea was still warm.", "Summer came early that year.")
# Short sentences, 1 to 3 words, so filler can hit any word count exactly.
_FILLER_SHORT = ("Later.", "Silence.", "Time passed.", "It rained.", "All was quiet.", "Nobody spoke.")


def _filler_sentence(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(_FILLER_SAYINGS)
    subject, verb, place = rng.choice(_FILLER_SUBJECTS), rng.choice(_FILLER_VERBS), rng.choice(_FILLER_PLACES)
    return f"{subject} {verb} {place}{rng.choice(_FILLER_TAILS)}."


def _filler(rng: random.Random, num_words: int) -> list[str]:
    """Neutral sentences, exactly `num_words` words in all; none states a fact or uses a fact's words."""
    sentences: list[str] = []
    remaining = num_words
    while remaining > 0:
        sentence = _filler_sentence(rng) if remaining > 3 else rng.choice(_FILLER_SHORT)
        if _count_words(sentence) <= remaining:
            sentences.append(sentence)
            remaining -= _count_words(sentence)
    return sentences


def _count_words(text: str) -> int:
    return len(text.split())


def _recall_episode(rng: random.Random, distance: int) -> tuple[Probe, str]:
    """A recall question `distance` words after its fact, and the end of the fact's sentence."""
    facts = _make_facts(rng, rng.randint(1, MAX_FACTS_PER_DOCUMENT))
    queried, others = facts[0], facts[1:]
    # Other facts go before the queried one, or after it when they fit in the
    # distance; filler makes up the rest.
    before, between = [], []
    budget = distance
    for other in others:
        if rng.random() < 0.5 and _count_words(other.sentence) <= budget:
            between.append(other.sentence)
            budget -= _count_words(other.sentence)
        else:
            before.append(other.sentence)
    between += _filler(rng, budget)
    rng.shuffle(between)
    opening = [_filler_sentence(rng) for _ in range(rng.randint(0, 2))]
    rng.shuffle(before)
    parts = opening + before + [queried.sentence] + between + [queried.question]
    distractors = _recall_distractors(rng, queried, others)
    return Probe("recall", " ".join(parts), queried.answer, distractors, distance), queried.ending


def _log_uniform_distance(rng: random.Random, max_distance: int) -> int:
    # Log-uniform in [0, max_distance]: short and long dependencies both get plenty of examples.
    return round(math.exp(rng.uniform(0.0, math.log(max_distance + 1)))) - 1


def _recall_document(rng: random.Random, max_distance: int) -> str:
    probe, ending = _recall_episode(rng, _log_uniform_distance(rng, max_distance))
    return probe.prompt + probe.answer + ending


# ---- Copying

COPY_WORDS = tuple(
    """apple river stone cloud green quick happy window garden music paper silver winter summer candle forest
    mountain ocean letter yellow orange purple little bright quiet gentle simple yesterday tomorrow morning
    evening
    pencil button castle dragon finger hammer ladder mirror needle pillow rocket saddle ticket violin wallet
    zebra anchor basket carpet desert engine feather guitar harbor island jacket kitten lemon magnet nest
    onion pepper rabbit shadow tiger umbrella valley whistle yogurt bottle camera dinner eagle flower honey
    jungle kingdom lantern notebook orbit planet puzzle rainbow spider tunnel velvet wizard
    run jump swim read write sing dance climb build paint cook drive sleep laugh think open close carry
    red blue black white brown warm cold soft loud slow fast tall short round sharp sweet""".split()
)
COPY_MIN_WORDS, COPY_MAX_WORDS = 3, 12


def _copy_words(rng: random.Random) -> list[str]:
    # Distinct words, so each word has exactly one successor to copy.
    return rng.sample(COPY_WORDS, rng.randint(COPY_MIN_WORDS, COPY_MAX_WORDS))


def _copy_episode(rng: random.Random, words: list[str], gap: int) -> str:
    """The list, `gap` words of filler, then the list again: "Repeat: a b c. <filler> Again: a b c."."""
    sequence = " ".join(words)
    filler = "".join(f" {sentence}" for sentence in _filler(rng, gap))
    return f"Repeat: {sequence}.{filler} Again: {sequence}."


def _copy_document(rng: random.Random, max_distance: int, mix: Mix) -> str:
    cap = max_distance if mix.copy_max_gap is None else min(max_distance, mix.copy_max_gap)
    episodes = []
    for _ in range(rng.randint(1, 3)):
        words = _copy_words(rng)
        episodes.append(_copy_episode(rng, words, _log_uniform_distance(rng, cap)))
    return " ".join(episodes)


# ---- Documents


def _rng(stream: str, seed: int) -> random.Random:
    return random.Random(f"hf_tinytx.corpus/{stream}/{seed}")


def _check_int(name: str, value, minimum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {wanted}, got {value!r}.")


def _documents(rng: random.Random, num_documents: int, kinds: tuple[str, ...], max_recall_distance: int,
               mix: Mix) -> list[str]:
    makers = {
        "coref": lambda r: _coref_document(r, mix),
        "recall": lambda r: _recall_document(r, max_recall_distance),
        "copy": lambda r: _copy_document(r, max_recall_distance, mix),
    }
    weights = mix.weights(kinds)
    draw = (lambda: rng.choice(kinds)) if weights is None else (lambda: rng.choices(kinds, weights)[0])
    return [makers[draw()](rng) for _ in range(num_documents)]


def generate_documents(
    num_documents: int, seed: int = 0, kinds: tuple[str, ...] = ("coref", "recall", "copy"),
    max_recall_distance: int = 200, mix: Mix = DEFAULT_MIX,
) -> list[str]:
    """`num_documents` documents of the `kinds` (drawn with the odds of `mix`);
    the same seed gives the same list.

    `max_recall_distance` caps the words between a fact and its question, and between a list and its
    repetition (both drawn log-uniformly from 0 to the cap).
    """
    _check_int("num_documents", num_documents, 0)
    _check_int("seed", seed)
    _check_int("max_recall_distance", max_recall_distance, 0)
    kinds = tuple(kinds) if not isinstance(kinds, str) else (kinds,)
    unknown = [kind for kind in kinds if kind not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"`kinds` must be a non-empty tuple drawn from {KINDS}, got {kinds!r}.")
    weights = mix.weights(kinds)
    if weights is not None and not any(weights):
        raise ValueError(f"The mix gives no weight to any of `kinds` {kinds!r}; ask for a kind it draws.")
    return _documents(_rng("documents", seed), num_documents, kinds, max_recall_distance, mix)


def default_corpus(num_documents: int = 20000, seed: int = 0, mix: Mix = DEFAULT_MIX) -> dict[str, list[str]]:
    """`num_documents` training documents and a validation split one twentieth as large, from its own
    seed stream and disjoint from training."""
    _check_int("num_documents", num_documents, 1)
    train = generate_documents(num_documents, seed=seed, mix=mix)
    seen = set(train)
    rng = _rng("validation", seed)
    validation: list[str] = []
    num_validation = max(1, num_documents // 20)
    while len(validation) < num_validation:
        document = _documents(rng, 1, KINDS, 200, mix)[0]
        if document not in seen:
            seen.add(document)
            validation.append(document)
    return {"train": train, "validation": validation}


# ---- Probes


def made_up_coref_probes(num_probes: int = 100, seed: int = 12345) -> list[Probe]:
    """Coreference probes whose two nouns are made-up words (kind
    "coref_made_up", for claim 4's ablations)."""
    _check_int("num_probes", num_probes, 1)
    _check_int("seed", seed)
    rng = _rng("probes/coref_made_up", seed)
    real = set().union(*(template.a_nouns + template.b_nouns for template in COREF_TEMPLATES))
    probes = []
    while len(probes) < num_probes:
        item = _coref_item(rng, made_up_share=1.0)
        if {item.referent, item.other} & real:
            continue  # a syllable draw can spell a frame's noun ("cow"): that one has a class
        probes.append(item.probe("coref_made_up"))
    return probes


def _copy_probe(rng: random.Random, gap: int) -> Probe:
    """Asks for the word after the first `known` words of the repetition, `gap`
    words of filler after the list."""
    words = _copy_words(rng)
    known = rng.randrange(len(words))
    answer = words[known]
    others = [word for word in words if word != answer]
    episode = _copy_episode(rng, words, gap)
    prompt = episode[: episode.index(" Again:")] + " Again:" + "".join(f" {word}" for word in words[:known])
    distractors = tuple(f" {word}" for word in rng.sample(others, min(3, len(others))))
    return Probe("copy", prompt, f" {answer}", distractors, distance=gap)


def make_probes(
    num_per_kind: int = 100, seed: int = 12345, recall_distances: tuple[int, ...] = (10, 50, 200, 400),
    copy_distances: tuple[int, ...] = (0,),
) -> list[Probe]:
    """Held-out test questions: `num_per_kind` each of coref and coref_new_nouns, and of recall and copy at
    each of their distances (exact, in words). Each kind has its own seed stream. Recall at 400 lies beyond
    the training cap of 200 on purpose: does recall carry further than trained?
    """
    _check_int("num_per_kind", num_per_kind, 1)
    _check_int("seed", seed)
    for name, distances in (("recall_distances", recall_distances), ("copy_distances", copy_distances)):
        if isinstance(distances, int):
            raise ValueError(f"`{name}` must be a tuple of integers, e.g. ({distances},).")
        for distance in distances:
            _check_int(f"each of `{name}`", distance, 0)

    probes: list[Probe] = []
    for held_out, kind in ((False, "coref"), (True, "coref_new_nouns")):
        rng = _rng(f"probes/{kind}", seed)
        probes += [_coref_item(rng, held_out=held_out).probe(kind) for _ in range(num_per_kind)]
    for distance in recall_distances:
        rng = _rng(f"probes/recall@{distance}", seed)
        probes += [_recall_episode(rng, distance)[0] for _ in range(num_per_kind)]
    for distance in copy_distances:
        rng = _rng("probes/copy" if distance == 0 else f"probes/copy@{distance}", seed)
        probes += [_copy_probe(rng, distance) for _ in range(num_per_kind)]
    return probes


__all__ = [
    "COREF_TEMPLATES", "HELD_OUT_NOUNS", "KINDS", "DEFAULT_MIX", "RULE_MIX", "Mix", "PROBE_KINDS",
    "CorefTemplate", "Probe", "default_corpus", "generate_documents", "made_up_coref_probes", "make_probes",
]
