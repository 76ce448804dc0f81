"""The built-in corpus: deterministic, built on the explainers' sentences, recall at the promised distance,
held-out nouns kept out of every document, and probes that are well-formed multiple-choice questions."""

import re

import pytest

from hf_tinytx.corpus import (
    COREF_TEMPLATES,
    DEFAULT_MIX,
    HELD_OUT_NOUNS,
    RULE_MIX,
    Mix,
    default_corpus,
    generate_documents,
    made_up_coref_probes,
    make_probes,
)


SENTENCE_END = re.compile(r"(?<=\.) ")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z]+", text.lower()))


def parse_coref(statement: str):
    """(first noun, second noun, adjective, the template that wrote it) of a coref statement."""
    first, second, adjective = re.fullmatch(
        r"The (\w+) .* the (\w+) because it was too (\w+)\.", statement
    ).groups()
    template = next(t for t in COREF_TEMPLATES
                    if t.sentence.format(a=first, b=second, adjective=adjective) == statement)
    return first, second, adjective, template


def test_same_seed_same_documents_and_probes():
    assert generate_documents(40, seed=3) == generate_documents(40, seed=3)
    assert generate_documents(40, seed=3) != generate_documents(40, seed=4)
    assert make_probes(5, seed=7) == make_probes(5, seed=7)
    assert make_probes(5, seed=7) != make_probes(5, seed=8)


@pytest.mark.parametrize(
    "sentence, referent",
    [
        ("The animal didn't cross the street because it was too tired.", "animal"),
        ("The animal didn't cross the street because it was too wide.", "street"),
        ("The bandage would not fit in the case because it was too large.", "bandage"),
        ("The bandage would not fit in the case because it was too small.", "case"),
    ],
)
def test_the_explainers_sentences_belong_to_the_grammar(sentence, referent):
    # Each seed sentence is produced by some template, and its adjective sends "it"
    # to the noun the explainers say.
    matches = []
    for template in COREF_TEMPLATES:
        pattern = (
            re.escape(template.sentence).replace(r"\{a\}", "(?P<a>\\w+)").replace(r"\{b\}", "(?P<b>\\w+)")
        )
        pattern = pattern.replace(r"\{adjective\}", "(?P<adjective>\\w+)")
        found = re.fullmatch(pattern, sentence)
        if found and found["a"] in template.a_nouns and found["b"] in template.b_nouns:
            role = "a" if found["adjective"] in template.a_adjectives else "b"
            assert found["adjective"] in (template.a_adjectives if role == "a" else template.b_adjectives)
            matches.append(found[role])
    assert matches == [referent]


def test_coref_documents_name_the_referent_of_it():
    documents = generate_documents(300, seed=1, kinds=("coref",))
    assert any("because it was too tired." in document for document in documents)
    checked = 0
    for document in documents:
        sentences = SENTENCE_END.split(document)
        assert len(sentences) % 2 == 0
        for statement, follow_up in zip(sentences[::2], sentences[1::2]):
            first, second, adjective, template = parse_coref(statement)
            referent = first if adjective in template.a_adjectives else second
            assert follow_up == f"The {referent} was too {adjective}."
            checked += 1
    assert checked > 300


def test_made_up_nouns_stand_in_either_role_so_the_class_of_a_noun_gives_nothing_away():
    """RULE_MIX (claim 4's corpus): three statements in four name two made-up
    nouns; a plain `Mix()` names none."""
    frame_words = set().union(*(_words(" ".join((t.sentence, *t.a_nouns, *t.b_nouns, *t.a_adjectives,
                                                 *t.b_adjectives))) for t in COREF_TEMPLATES))
    assert all(_words(document) <= frame_words
               for document in generate_documents(300, seed=2, kinds=("coref",), mix=Mix()))
    referents = {"a": 0, "b": 0}
    made_up = set()
    for document in generate_documents(300, seed=2, kinds=("coref",), mix=RULE_MIX):
        for statement in SENTENCE_END.split(document)[::2]:
            first, second, adjective, template = parse_coref(statement)
            if first in template.a_nouns and second in template.b_nouns:
                continue  # the frame's own nouns
            assert first != second
            made_up |= {first, second}
            referents["a" if adjective in template.a_adjectives else "b"] += 1
    assert referents["a"] > 50 and referents["b"] > 50
    assert len(made_up) > 500  # fresh nouns, not a second fixed list to learn


def test_the_default_mix_pairs_made_up_nouns_that_begin_alike_and_rule_mix_does_not():
    """DEFAULT_MIX: half its made-up pairs share their opening letters, so the noun
    is chosen past its first piece."""
    def shared_share(mix):
        shared = pairs = 0
        for document in generate_documents(400, seed=2, kinds=("coref",), mix=mix):
            for statement in SENTENCE_END.split(document)[::2]:
                first, second, _, _ = parse_coref(statement)
                if not any(first in t.a_nouns for t in COREF_TEMPLATES):
                    pairs += 1
                    shared += first[0] == second[0]
        return shared / pairs
    assert 0.45 < shared_share(DEFAULT_MIX) < 0.65 and shared_share(RULE_MIX) < 0.2


def test_made_up_coref_probes_ask_for_a_made_up_noun_in_either_role():
    probes = made_up_coref_probes(200, seed=3)
    assert made_up_coref_probes(200, seed=3) == probes and made_up_coref_probes(200, seed=4) != probes
    frame_nouns = set().union(*(t.a_nouns + t.b_nouns for t in COREF_TEMPLATES))
    firsts = 0
    for probe in probes:
        assert probe.prompt.endswith(". The")
        first, second, adjective, template = parse_coref(probe.prompt.removesuffix(" The"))
        assert probe.kind == "coref_made_up" and {first, second}.isdisjoint(frame_nouns | HELD_OUT_NOUNS)
        referent = first if adjective in template.a_adjectives else second
        assert probe.answer == f" {referent}" and probe.distractors == (
            f" {({first, second} - {referent}).pop()}",
        )
        firsts += referent == first
    assert 70 < firsts < 130  # the referent is either noun, so "the first one" scores at chance


@pytest.mark.parametrize("distance", [0, 10, 50, 200, 400])
def test_recall_probes_ask_at_exactly_the_requested_distance(distance):
    for probe in [p for p in make_probes(20, seed=5, recall_distances=(distance,)) if p.kind == "recall"]:
        question = probe.prompt[probe.prompt.rindex(". ") + 2 :]
        fact_start = probe.prompt.index(question + probe.answer)
        fact_end = probe.prompt.index(".", fact_start + len(question + probe.answer)) + 1
        between = probe.prompt[fact_end : len(probe.prompt) - len(question)]
        assert len(between.split()) == distance == probe.distance
        # The fact is stated once; the question is its opening, at the very end.
        assert probe.prompt.count(question + probe.answer) == 1


def test_recall_documents_restate_an_earlier_fact_within_the_cap():
    cap = 30
    gaps = []
    for document in generate_documents(200, seed=2, kinds=("recall",), max_recall_distance=cap):
        sentences = SENTENCE_END.split(document)
        first = sentences.index(sentences[-1])
        assert first < len(sentences) - 1, "the last sentence must restate a fact stated earlier"
        gaps.append(sum(len(s.split()) for s in sentences[first + 1 : -1]))
    assert max(gaps) <= cap
    assert min(gaps) < cap // 3 and max(gaps) > cap // 2  # the distances spread over the range


def test_copy_documents_repeat_their_words():
    for document in generate_documents(100, seed=4, kinds=("copy",)):
        episodes = re.findall(r"Repeat: ([^.]+)\.((?: [^.]+\.)*?) Again: ([^.]+)\.", document)
        assert episodes and " ".join(f"Repeat: {a}.{gap} Again: {b}." for a, gap, b in episodes) == document
        assert all(first == second for first, _, second in episodes)
        assert all("Repeat" not in gap and "Again" not in gap for _, gap, _ in episodes)
    def gaps(mix):
        return [
            len(gap.split())
            for document in generate_documents(300, seed=4, kinds=("copy",), max_recall_distance=60, mix=mix)
            for _, gap, _ in re.findall(r"Repeat: ([^.]+)\.((?: [^.]+\.)*?) Again: ([^.]+)\.", document)
        ]
    assert min(gaps(Mix())) == 0 and 30 < max(gaps(Mix())) <= 60  # from no filler at all to near the cap
    # its own cap
    assert min(gaps(DEFAULT_MIX)) == 0 and 5 < max(gaps(DEFAULT_MIX)) <= DEFAULT_MIX.copy_max_gap


def test_held_out_nouns_never_appear_in_documents():
    corpus, rule = default_corpus(num_documents=2000, seed=0), default_corpus(
        num_documents=2000, seed=0, mix=RULE_MIX
    )
    documents = generate_documents(2000, seed=9) + corpus["train"] + corpus["validation"]
    documents += rule["train"] + rule["validation"]
    seen = set().union(*(_words(document) for document in documents))
    assert HELD_OUT_NOUNS.isdisjoint(seen)
    # ...while the probes that test generalisation are made of exactly those nouns.
    new_noun_probes = [p for p in make_probes(30) if p.kind == "coref_new_nouns"]
    for probe in new_noun_probes:
        assert {probe.answer.strip(), probe.distractors[0].strip()} <= HELD_OUT_NOUNS


def test_default_corpus_splits_are_disjoint():
    corpus = default_corpus(num_documents=1000, seed=1)
    assert len(corpus["train"]) == 1000 and len(corpus["validation"]) == 50
    assert not set(corpus["train"]) & set(corpus["validation"])
    assert corpus["train"] == generate_documents(1000, seed=1)


def test_probes_are_well_formed_multiple_choice():
    probes = make_probes(num_per_kind=10, seed=3, recall_distances=(10, 200))
    counts = {}
    for probe in probes:
        key = (probe.kind, probe.distance) if probe.kind == "recall" else probe.kind
        counts[key] = counts.get(key, 0) + 1
        candidates = (probe.answer, *probe.distractors)
        assert probe.distractors and probe.answer not in probe.distractors
        assert len(set(candidates)) == len(candidates)
        assert all(c.startswith(" ") and c.strip() for c in candidates)
        if probe.kind.startswith("coref"):
            assert probe.distance == 0 and probe.prompt.endswith(". The")
            nouns = re.findall(r"the (\w+)", probe.prompt.lower())[:2]
            assert {probe.answer, probe.distractors[0]} == {f" {noun}" for noun in nouns}
    assert counts == {"coref": 10, "coref_new_nouns": 10, "copy": 10, ("recall", 10): 10, ("recall", 200): 10}


def test_copy_probes_ask_for_the_next_repeated_word():
    probes = [p for p in make_probes(30, seed=6, copy_distances=(0, 50)) if p.kind == "copy"]
    assert sorted({p.distance for p in probes}) == [0, 50] and len(probes) == 60
    for probe in probes:
        listed, gap, copied = re.fullmatch(r"Repeat: ([^.]+)\.(.*) Again:(.*)", probe.prompt).groups()
        listed, copied = listed.split(), copied.split()
        assert listed[: len(copied)] == copied
        assert probe.answer == f" {listed[len(copied)]}"
        assert {d.strip() for d in probe.distractors} <= set(listed)
        assert len(gap.split()) == probe.distance


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: generate_documents(5, kinds=("poetry",)), "kinds"),
        (lambda: generate_documents(-1), "num_documents"),
        (lambda: generate_documents(5, max_recall_distance=-3), "max_recall_distance"),
        (lambda: make_probes(0), "num_per_kind"),
        (lambda: made_up_coref_probes(0), "num_probes"),
        (lambda: generate_documents(5, kinds=("copy",), mix=RULE_MIX), "no weight"),
        (lambda: make_probes(2, recall_distances=10), "recall_distances"),
        (lambda: default_corpus(0), "num_documents"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
