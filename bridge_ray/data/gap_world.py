"""The gap world (``data.world: gap``): a world where the frozen retriever fails and a trained query encoder can win.

Mechanism: relation jargon. Every entity has one short passage per fact ("Kael Morvan was born in the town of
Thornwick."), and questions name the fact only by an invented word that no passage ever contains ("What is
the vessen of Kael Morvan?"). The name pulls the entity's five to seven passages into the frozen encoder's
top k, so the gold passage stays reachable; the jargon word means nothing to the frozen encoder, so which
of them reach the top m it does not decide (the frozen encoder prefers, whatever the word, the passages
whose value is another name: a mentor, a founder). Each jargon word is used the same way in every
question, so the train split teaches a query encoder what it means ("vessen" -> "born in the town of"), and
held-out questions ask the same relations of other entities. Two-hop questions chain two relations
("the torrel of the vessen of X"), comparisons compare one relation of two entities.

It reuses the bundled world's entities, file layout, phrasings and cache (:class:`~bridge_ray.data.world.
WorldKind`); every question also holds ``metadata.gold_queries``, the search per hop that finds its gold
passage ("Kael Morvan vessen"): the warm-up's demonstrations issue them. Near-duplicate entities are left
out (``twin_fraction`` 0) and there are more towns per person than in the bundled world (every town a
person was born in names it in a passage, and those must not crowd the town's own passages out of the top
k): the gap is the jargon alone.

Clean splits (version 2). A *fact* is one (entity, relation) pair, and so one passage: the gap world states
each fact in a passage of its own, so the facts a question's answer rests on are its gold passage ids
(:func:`question_facts`): one for a single-hop question, two for a two-hop question (the hop to the bridge
entity and the asked relation of it) and two for a comparison (the compared relation of each entity). The
test and dev questions ask each fact once, no fact of one is asked by the other, and no train question asks
any of them: a held-out question is answered by learning what the jargon means, never by recalling a train
question about the same fact. Each split holds the question types in ``TYPE_SHARES`` (version 1 drew one
pool and shuffled it into the splits, so 109 of its 200 test questions asked a fact a train question asked).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bridge_ray.data.world import (
    LANDMARK_ADJ,
    LANDMARK_NOUN,
    PHRASINGS,
    Entity,
    WorldKind,
    WorldSize,
    _a,
    _entities,
    _their,
)

GAP_VERSION = 2


@dataclass(frozen=True)
class Relation:
    """One fact of an entity kind: how its passage states it, and the jargon word questions ask it by."""

    kind: str  # person | organisation | city
    fact: str  # key of Entity.facts, and the passage's role in Entity.doc_ids
    jargon: str  # never in a passage
    passage: str  # {n}: the name, {v}: the value, {their}: a person's possessive
    target: str | None = None  # the kind the value names, for relations a two-hop question can chain through


# fmt: off
RELATIONS = (
    Relation("person", "city", "vessen", "{n} was born in the town of {v}.", "city"),
    Relation("person", "born", "quorlat", "{n} came into the world in the year {v}."),
    Relation("person", "profession", "trindle", "By trade, {n} was {v}."),
    Relation("person", "employer", "haskory", "{n} spent {their} working life at the {v}.", "organisation"),
    Relation("person", "joined", "ombrel", "{n} took up a post in {v}."),
    Relation("person", "mentor", "pellorin", "{n} was taught by {v}.", "person"),
    Relation("person", "died", "fennick", "{n} died in {v}."),
    Relation("organisation", "founded", "zanthe", "The {n} opened in {v}."),
    Relation("organisation", "city", "morrowen", "The {n} has its seat in {v}.", "city"),
    Relation("organisation", "founder", "kestrith", "The {n} was set up by {v}.", "person"),
    Relation("organisation", "staff", "drevask", "The {n} employs about {v} people."),
    Relation("organisation", "emblem", "lisquet", "The {n} bears {v} on its seal."),
    Relation("organisation", "charter", "vorsage", "The {n} received its charter in {v}."),
    Relation("city", "country", "ulmark", "{n} is a town in {v}."),
    Relation("city", "river", "torrel", "The {v} flows through {n}."),
    Relation("city", "founded", "brisquel", "{n} was settled in {v}."),
    Relation("city", "landmark", "sennave", "{n} is known for {v}."),
    Relation("city", "population", "gavrel", "{n} has about {v} inhabitants."),
)
# fmt: on
EARLIER = (("person", "born"), ("organisation", "founded"), ("city", "founded"))  # comparisons: who came first
SHARED = (("person", "city"), ("person", "profession"))  # ... the same?

# Question templates per phrasing (index for index, as in the bundled world): {j} the jargon word, {n} the
# entity ("the" before an organisation), {j1} / {j2} the hops of a chain, {a} / {b} the compared entities.
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "default": {
        "single": ("What is the {j} of {n}?", "Which {j} belongs to {n}?"),
        "two_hop": ("What is the {j2} of the {j1} of {n}?",),
        "earlier": ("Which has the earlier {j}, {a} or {b}?",),
        "shared": ("Do {a} and {b} have the same {j}?",),
    },
    "paraphrase": {
        "single": ("Name the {j} of {n}.", "{n} has which {j}?"),
        "two_hop": ("Name the {j2} of the {j1} of {n}.",),
        "earlier": ("Of {a} and {b}, whose {j} comes first?",),
        "shared": ("Is the {j} of {a} the same as that of {b}?",),
    },
    "alternate": {  # trained on, never evaluated (warmup.phrasings)
        "single": ("Tell me the {j} of {n}.", "What {j} does {n} have?"),
        "two_hop": ("For the {j1} of {n}, what is the {j2}?",),
        "earlier": ("Whose {j} is earlier: {a} or {b}?",),
        "shared": ("Do {a} and {b} share one {j}?",),
    },
}
assert all({s: len(t) for s, t in v.items()} == {s: len(t) for s, t in TEMPLATES["default"].items()}
           for v in TEMPLATES.values())

EMBLEMS = [f"{adj.lower()} {noun.lower()}" for adj in LANDMARK_ADJ for noun in LANDMARK_NOUN]
# The filler sentences of this world cite a made-up source: every passage holds a name besides its title's,
# as those whose value is a name (a mentor, an employer) do.
SOURCES = ["Ardovel", "Brenmisk", "Caltherow", "Dovrane", "Elskarth", "Faldrune", "Gorlasse", "Hestrun",
           "Ivermold", "Jastrelle", "Korvenna", "Lumbrisk", "Marrowind", "Nestaval", "Orvelline", "Pardusk"]
CITATIONS = ["So says the chronicle of {s}.", "The annals of {s} record it.", "{s} notes it in a letter.",
             "A register kept by {s} confirms it."]


def _gap_entities(rng: random.Random, size: WorldSize) -> tuple[list[Entity], list[Entity], list[Entity]]:
    """The bundled world's entities, with a year of death per person and three more facts per organisation."""
    cities, organisations, people = _entities(rng, size)
    for o in organisations:
        o.facts["staff"] = rng.randrange(2, 90) * 10
        o.facts["emblem"] = f"a {rng.choice(EMBLEMS)}"
        o.facts["charter"] = o.facts["founded"] + rng.randrange(1, 40)
    for p in people:
        p.facts["died"] = p.facts["born"] + rng.randrange(35, 90)
    return cities, organisations, people


def _relations(entity: Entity) -> list[Relation]:
    return [r for r in RELATIONS if r.kind == entity.kind and entity.facts.get(r.fact) is not None]


def _gap_passages(rng: random.Random, cities, organisations, people) -> list[tuple[Entity, str, str]]:
    """One passage per fact of every entity, the fact's role naming it."""
    out = []
    for entity in [*cities, *organisations, *people]:
        for relation in _relations(entity):
            their = _their(entity.facts["pronoun"]) if entity.kind == "person" else ""
            text = relation.passage.format(n=entity.name, v=_stated(entity, relation), their=their)
            citation = rng.choice(CITATIONS).format(s=rng.choice(SOURCES))
            out.append((entity, relation.fact, f"{text} {citation}"))
    return out


def _answer(entity: Entity, relation: Relation) -> str:
    value = entity.facts[relation.fact]
    return f"{value:,}" if relation.fact == "population" else str(value)


def _stated(entity: Entity, relation: Relation) -> str:
    """The fact as its passage states it: the answer, with an article before a profession."""
    return _a(entity.facts["profession"]) if relation.fact == "profession" else _answer(entity, relation)


def _capitalised(text: str) -> str:
    """A question starting with "the" (an organisation) starts with "The"."""
    return text[0].upper() + text[1:]


def _gap_questions(rng: random.Random, cities, organisations, people) -> dict[str, Callable]:
    """Question generators per type; each returns (texts per phrasing, answers, gold doc ids, gold queries)."""
    pools = {"person": people, "organisation": organisations, "city": cities}
    by_name = {e.name: e for pool in pools.values() for e in pool}

    def phrase(slot: str, **names: str) -> tuple[str, ...]:
        """One template of ``slot`` in every phrasing (the same index in each); a lone template draws nothing."""
        options = list(zip(*(TEMPLATES[p][slot] for p in PHRASINGS), strict=True))
        chosen = options[0] if len(options) == 1 else rng.choice(options)
        return tuple(_capitalised(t.format(**names)) for t in chosen)

    def mention(entity: Entity) -> str:
        return f"the {entity.name}" if entity.kind == "organisation" else entity.name

    def hop(entity: Entity, relation: Relation) -> tuple[str, str]:
        """(gold doc id, gold query) of one hop."""
        return entity.doc_ids[relation.fact], f"{entity.name} {relation.jargon}"

    def entity_of_kind() -> Entity:
        kind = rng.choices(["person", "organisation", "city"], weights=[6, 2, 2])[0]
        return rng.choice(pools[kind])

    def single():
        entity = entity_of_kind()
        relation = rng.choice(_relations(entity))
        doc, query = hop(entity, relation)
        return phrase("single", j=relation.jargon, n=mention(entity)), [_answer(entity, relation)], [doc], [query]

    def two_hop():
        entity = rng.choice([*people, *organisations])
        first = rng.choice([r for r in _relations(entity) if r.target])
        bridge = by_name[entity.facts[first.fact]]
        second = rng.choice(_relations(bridge))
        (doc1, query1), (doc2, query2) = hop(entity, first), hop(bridge, second)
        texts = phrase("two_hop", j1=first.jargon, j2=second.jargon, n=mention(entity))
        return texts, [_answer(bridge, second)], [doc1, doc2], [query1, query2]

    def comparison():
        if rng.random() < 0.5:
            kind, fact = rng.choice(EARLIER)
            a, b = rng.sample(pools[kind], 2)
            if a.facts[fact] == b.facts[fact]:
                return None
            answer = min((a, b), key=lambda e: e.facts[fact]).name
            slot = "earlier"
        else:
            kind, fact = rng.choice(SHARED)
            a = rng.choice(pools[kind])
            same = [e for e in pools[kind] if e is not a and e.facts[fact] == a.facts[fact]]
            b = rng.choice(same) if same and rng.random() < 0.5 else rng.choice([e for e in pools[kind] if e is not a])
            answer = "yes" if a.facts[fact] == b.facts[fact] else "no"
            slot = "shared"
        relation = next(r for r in RELATIONS if (r.kind, r.fact) == (kind, fact))
        (doc_a, query_a), (doc_b, query_b) = hop(a, relation), hop(b, relation)
        texts = phrase(slot, j=relation.jargon, a=mention(a), b=mention(b))
        return texts, [answer], [doc_a, doc_b], [query_a, query_b]

    return {"single": single, "two_hop": two_hop, "comparison": comparison}


def question_facts(question: dict) -> frozenset[str]:
    """The facts a question row asks: its gold passages, one per (entity, relation) it rests on."""
    return frozenset(question["metadata"]["gold_doc_ids"])


GAP_WORLD = WorldKind(
    "gap",
    GAP_VERSION,
    {
        "default": WorldSize(
            countries=6, cities=200, organisations=80, people=400, twin_fraction=0.0, train=1200, dev=200, test=200
        ),
        "small": WorldSize(
            countries=3, cities=30, organisations=12, people=60, twin_fraction=0.0, train=60, dev=20, test=20
        ),
    },
    _gap_entities,
    _gap_passages,
    _gap_questions,
    question_facts,
)
