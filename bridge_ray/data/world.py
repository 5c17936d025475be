"""The bundled synthetic knowledge world: fictional people, places and organisations, with QA splits.

No model knows these facts, so answering needs retrieval. Two things keep the frozen retriever imperfect
but leave it something to learn: near-duplicate entities (a vowel apart in name, sharing profession,
employer, country or kind, differing in the asked fact), and questions phrased unlike the passages
("hometown" for "born in", "employed" for "spent her working life at").

Files (FlashRAG formats): ``corpus.jsonl`` rows ``{"id": "<row>", "contents": "\\"Title\\"\\ntext"}`` and
``train/dev/test.jsonl`` rows ``{"id", "question", "golden_answers", "metadata": {"type", "gold_doc_ids"}}``
where ``type`` is single | two_hop | comparison and ``gold_doc_ids`` holds one corpus id per hop.
A second kind of world (:mod:`bridge_ray.data.gap_world`) shares this module's entities and assembly
through :class:`WorldKind`; a question of a kind that names its search queries also holds
``metadata.gold_queries``, one per hop.
Everything is a function of the seed, the size and the phrasing: ``"default"`` (the question templates
agents train on), ``"paraphrase"`` (every template reworded, for checking that an agent generalises
beyond the phrasings it was trained on) or ``"alternate"`` (a third wording, for the warm-up to train on
beside the default: ``warmup.phrasings``). Every phrasing draws the same random numbers, so at one seed and
size they have the same corpus and the same questions (ids, answers, gold passages) in other words.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bridge_ray.cache import cache_root, cached_directory
from bridge_ray.cache_key import CacheKey
from bridge_ray.errors import refuse_taken_folder

GENERATOR_VERSION = 1  # the default kind's (WorldKind.version)
# A world's cache directory. Its callers pass the seed, size, phrasing and kind (``data.world*`` and
# ``warmup.phrasings`` are read by coordinator/inputs.py); bump the version when the files written here change for every
# kind, a kind's ``version`` when its own output does.
WORLD_KEY = CacheKey("world", version=1)
SPLITS = ("train", "dev", "test")
QUESTION_TYPES = ("single", "two_hop", "comparison")
TYPE_SHARES = {"single": 0.4, "two_hop": 0.35, "comparison": 0.25}
PHRASINGS = ("default", "paraphrase", "alternate")
WORLD_INFO = "world.json"
WORLD_FILES = ("corpus.jsonl", *(f"{split}.jsonl" for split in SPLITS), WORLD_INFO)  # world.json last: complete


@dataclass(frozen=True)
class WorldSize:
    countries: int = 8
    cities: int = 120
    organisations: int = 200
    people: int = 1000
    twin_fraction: float = 0.3  # share of entities generated as near-duplicates of another
    train: int = 1600
    dev: int = 300
    test: int = 300


DEFAULT_SIZE = WorldSize()
SMALL_SIZE = WorldSize(countries=3, cities=12, organisations=16, people=60, train=60, dev=20, test=20)

# Word lists, kept compact.
# fmt: off
ONSETS = [
    "b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "th", "v", "z", "sh",
    "c", "j", "w", "tr"
]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ia", "ei", "ou", "y"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k", "nd", "rn", "st", "x"]
CITY_SUFFIXES = ["", "", "ford", "mere", "holm", "vale", "wick", "stead", "burg", "haven"]
COUNTRY_SUFFIXES = ["ia", "and", "ora", "istan", "essa"]
ORG_KINDS = [
    "Shipyard", "Observatory", "Press", "University", "Savings Bank", "Theatre Company", "Glassworks", "Conservatory",
    "Botanical Society", "Railway Company", "Brewery", "Museum", "Cartographic Institute", "Clockworks", "Weaving Mill",
    "Academy of Sciences"
]
PROFESSIONS = [
    "cartographer", "glassblower", "astronomer", "violinist", "shipwright", "botanist", "archivist", "clockmaker",
    "engraver", "linguist", "surveyor", "apothecary", "stonemason", "playwright", "beekeeper", "ceramicist",
    "bookbinder", "architect"
]
LANDMARK_ADJ = [
    "Copper", "Silent", "Crooked", "Lantern", "Amber", "Iron", "Willow", "Granite", "Seven", "Painted", "Hollow",
    "Golden"
]
LANDMARK_NOUN = [
    "Bridge", "Tower", "Bell", "Gate", "Fountain", "Library", "Market", "Lighthouse", "Cathedral", "Arcade", "Stair",
    "Clock"
]
# fmt: on
FILLER = [
    "Records from that period are incomplete.",
    "Local histories disagree on several details.",
    "Little else survives in the archives.",
    "The matter is discussed in several regional chronicles.",
    "Later accounts added colourful but unverified anecdotes.",
    "",
    "",
]


# Question templates per phrasing and slot (what is asked about what). Each phrasing lists as many
# templates per slot as the default, index for index, so both phrasings consume the same random numbers
# and a question keeps its position, answer and gold passages whatever its phrasing. A slot with a single
# template draws nothing. Placeholders: {n} an entity's name, {a} and {b} the compared entities.
TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "default": {
        "person.city": (
            "What is the hometown of {n}?",
            "Where does {n} come from?",
            "In what town did {n} first see the light of day?",
        ),
        "person.born": ("When was {n} born?", "In which year did {n} come into the world?"),
        "person.profession": ("What was the occupation of {n}?", "What did {n} do for a living?"),
        "person.employer": ("Which institution employed {n}?", "For which organisation did {n} work?"),
        "person.mentor": ("Who taught {n}?", "Who was the mentor of {n}?"),
        "org.founded": ("When was the {n} founded?", "In what year did the {n} open its doors?"),
        "org.city": ("In which city is the {n} located?", "Where is the {n} headquartered?"),
        "org.founder": ("Who started the {n}?", "Who is the founder of the {n}?"),
        "city.river": ("Which river flows through {n}?",),
        "city.country": ("In which country is {n}?", "{n} belongs to which country?"),
        "city.landmark": ("What is {n} famous for?", "Which sight draws tourists to {n}?"),
        "city.founded": ("When was {n} established?", "How old is {n}: in which year was it settled?"),
        "two_hop.employer_founded": ("In what year was the organisation that employed {n} founded?",),
        "two_hop.employer_founder": ("Who founded the institution where {n} worked?",),
        "two_hop.home_river": ("Which river runs through the birthplace of {n}?",),
        "two_hop.home_country": ("In which country is the hometown of {n}?",),
        "two_hop.mentor_born": ("When was the teacher of {n} born?",),
        "two_hop.founder_profession": ("What was the profession of the person who founded the {n}?",),
        "comparison.born": ("Who was born first, {a} or {b}?",),
        "comparison.hometown": ("Do {a} and {b} share a hometown?",),
        "comparison.org_founded": ("Which is older, the {a} or the {b}?",),
        "comparison.city_founded": ("Which town was settled earlier, {a} or {b}?",),
    },
    "paraphrase": {
        "person.city": (
            "Name the town {n} hails from.",
            "{n} is originally from which town?",
            "Which town was the place of birth of {n}?",
        ),
        "person.born": ("What is the birth year of {n}?", "Give the year in which {n} entered the world."),
        "person.profession": ("What trade did {n} practise?", "{n} made a living in which profession?"),
        "person.employer": ("{n} was on the staff of which organisation?", "Name the employer of {n}."),
        "person.mentor": ("{n} was apprenticed to whom?", "Under whose guidance did {n} learn?"),
        "org.founded": ("What is the founding year of the {n}?", "Since which year has the {n} been in operation?"),
        "org.city": ("The {n} is based in which city?", "Name the city that is home to the {n}."),
        "org.founder": ("The {n} was created by whom?", "Who brought the {n} into being?"),
        "city.river": ("Name the river that passes through {n}.",),
        "city.country": ("Name the country that {n} is in.", "{n} is part of which nation?"),
        "city.landmark": ("Which landmark is {n} renowned for?", "Travellers to {n} go to see what?"),
        "city.founded": ("In what year did {n} come into being?", "{n} has existed since which year?"),
        "two_hop.employer_founded": ("The employer of {n} was founded in which year?",),
        "two_hop.employer_founder": ("Who was the founder of the organisation that had {n} on its staff?",),
        "two_hop.home_river": ("The town {n} hails from sits on which river?",),
        "two_hop.home_country": ("{n} hails from a town in which country?",),
        "two_hop.mentor_born": ("The person who taught {n} was born in which year?",),
        "two_hop.founder_profession": ("The {n} was created by someone of which profession?",),
        "comparison.born": ("Which of {a} and {b} is the elder?",),
        "comparison.hometown": ("Is the home town of {a} the same as that of {b}?",),
        "comparison.org_founded": ("Which has the earlier founding year, the {a} or the {b}?",),
        "comparison.city_founded": ("Of {a} and {b}, which town is older?",),
    },
    # Trained on, never evaluated: more wordings for the warm-up's demonstrations (warmup.phrasings), none of
    # them the paraphrase's, which stays the unseen wording that measures generalisation.
    "alternate": {
        "person.city": ("Which town is the birthplace of {n}?", "Where was {n} born?", "Tell me the home town of {n}."),
        "person.born": ("In what year was {n} born?", "What is the year of birth of {n}?"),
        "person.profession": ("What was {n} by trade?", "Which job did {n} have?"),
        "person.employer": ("Where was {n} employed?", "Which organisation had {n} as an employee?"),
        "person.mentor": ("Whose pupil was {n}?", "From whom did {n} learn the craft?"),
        "org.founded": ("What year was the {n} set up?", "When did the {n} begin?"),
        "org.city": ("Where is the {n}?", "Which city hosts the {n}?"),
        "org.founder": ("Who set up the {n}?", "Whose creation is the {n}?"),
        "city.river": ("What river is {n} on?",),
        "city.country": ("Which country does {n} lie in?", "What country contains {n}?"),
        "city.landmark": ("What should a visitor see in {n}?", "Which attraction is {n} known for?"),
        "city.founded": ("When was {n} founded?", "What year did {n} start as a settlement?"),
        "two_hop.employer_founded": ("When was the organisation {n} was employed by set up?",),
        "two_hop.employer_founder": ("Who set up the organisation that employed {n}?",),
        "two_hop.home_river": ("What river flows through the home town of {n}?",),
        "two_hop.home_country": ("What country is the birthplace of {n} in?",),
        "two_hop.mentor_born": ("In what year was the mentor of {n} born?",),
        "two_hop.founder_profession": ("What did the founder of the {n} do for a living?",),
        "comparison.born": ("Who is older: {a} or {b}?",),
        "comparison.hometown": ("Are {a} and {b} from one and the same town?",),
        "comparison.org_founded": ("Which was set up first, the {a} or the {b}?",),
        "comparison.city_founded": ("Which is the older town, {a} or {b}?",),
    },
}
assert all(  # parallel template lists: the phrasings must draw the same random numbers
    {slot: len(t) for slot, t in templates.items()} == {slot: len(t) for slot, t in TEMPLATES["default"].items()}
    for templates in TEMPLATES.values()
)


@dataclass
class Entity:
    kind: str  # person | organisation | city | country
    name: str
    facts: dict = field(default_factory=dict)
    doc_ids: dict = field(default_factory=dict)  # passage role -> corpus id
    twin_of: str | None = None


@dataclass
class World:
    corpus: list[dict]  # FlashRAG rows in id order
    splits: dict[str, list[dict]]
    seed: int
    size: WorldSize
    phrasing: str = "default"


class _Names:
    """Unique fictional names from syllables, and near-duplicates a vowel apart."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, syllables: int) -> str:
        parts = [self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables)]
        return ("".join(parts) + self.rng.choice(CODAS)).capitalize()

    def fresh(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted: reduce the world size")

    def near(self, name: str, word: int = -1) -> str:
        """``name`` with one vowel of its ``word``-th word changed (e.g. 'Ilsa Varen' -> 'Ilsa Varan')."""
        words = name.split(" ")
        target = words[word]
        positions = [i for i, ch in enumerate(target) if ch.lower() in "aeiouy"]
        for _ in range(50):
            i = self.rng.choice(positions)
            vowel = self.rng.choice([v for v in "aeiou" if v != target[i].lower()])
            vowel = vowel.upper() if target[i].isupper() else vowel
            words[word] = f"{target[:i]}{vowel}{target[i + 1 :]}"
            candidate = " ".join(words)
            if candidate not in self.used:
                self.used.add(candidate)
                return candidate
        raise RuntimeError(f"no near-duplicate of {name!r} left: reduce twin_fraction")


def _entities(rng: random.Random, size: WorldSize) -> tuple[list[Entity], list[Entity], list[Entity]]:
    """Cities, organisations and people; a ``twin_fraction`` of each is a near-duplicate of an earlier one."""
    names = _Names(rng)
    countries = [
        Entity("country", names.fresh(lambda: names.word(2).rstrip("aeiouy") + rng.choice(COUNTRY_SUFFIXES)))
        for _ in range(size.countries)
    ]
    rivers = [names.fresh(lambda: names.word(2)) for _ in range(max(4, size.cities // 3))]
    landmarks = [f"the {a} {n}" for a in LANDMARK_ADJ for n in LANDMARK_NOUN]
    rng.shuffle(landmarks)

    def twins(count: int, make_original, make_twin) -> list[Entity]:
        out: list[Entity] = []
        for _ in range(count):
            if out and rng.random() < size.twin_fraction:
                out.append(make_twin(rng.choice([e for e in out if e.twin_of is None])))
            else:
                out.append(make_original())
        return out

    def city_facts(country: Entity) -> dict:
        return {
            "country": country.name,
            "river": rng.choice(rivers),
            "founded": rng.randrange(900, 1700),
            "landmark": landmarks[rng.randrange(len(landmarks))],
            "population": rng.randrange(4, 400) * 1000,
        }

    cities = twins(
        size.cities,
        lambda: Entity(
            "city",
            names.fresh(lambda: names.word(rng.choice([1, 2])) + rng.choice(CITY_SUFFIXES)),
            city_facts(rng.choice(countries)),
        ),
        lambda o: Entity(
            "city",
            names.near(o.name),
            city_facts(next(c for c in countries if c.name == o.facts["country"])),
            twin_of=o.name,
        ),
    )

    def person(original: Entity | None) -> Entity:
        name = names.near(original.name) if original else names.fresh(lambda: f"{names.word(2)} {names.word(2)}")
        facts = {
            "born": original.facts["born"] + rng.choice([-1, 1]) * rng.randrange(1, 15)
            if original
            else rng.randrange(1720, 1940),
            "city": rng.choice(cities).name,
            "profession": original.facts["profession"] if original else rng.choice(PROFESSIONS),
            "pronoun": rng.choice(["she", "he"]),
        }
        return Entity("person", name, facts, twin_of=original.name if original else None)

    people = twins(size.people, lambda: person(None), person)
    by_name = {p.name: p for p in people}

    def org(original: Entity | None) -> Entity:
        if original:  # same kind and city, the first word of the name a vowel apart
            kind, city, name = original.facts["kind"], original.facts["city"], names.near(original.name, word=0)
        else:
            kind, city = rng.choice(ORG_KINDS), rng.choice(cities).name
            name = names.fresh(lambda: f"{names.word(2)} {kind}")
        founder = rng.choice(people)
        founded = founder.facts["born"] + rng.randrange(22, 60)
        return Entity(
            "organisation",
            name,
            {"kind": kind, "city": city, "founded": founded, "founder": founder.name},
            twin_of=original.name if original else None,
        )

    organisations = twins(size.organisations, lambda: org(None), org)
    by_org = {o.name: o for o in organisations}
    for p in people:  # career facts: an employer they joined after it was founded, a mentor born earlier
        twin = by_name.get(p.twin_of) if p.twin_of else None
        if twin is not None:
            employer = by_org[twin.facts["employer"]]
        else:
            open_by_40 = [o for o in organisations if o.facts["founded"] <= p.facts["born"] + 40]
            employer = rng.choice(open_by_40 or sorted(organisations, key=lambda o: o.facts["founded"])[:5])
        p.facts["employer"] = employer.name
        p.facts["joined"] = max(p.facts["born"] + 18, employer.facts["founded"] + 1) + rng.randrange(0, 8)
        elders = [q for q in people if q.facts["born"] < p.facts["born"] - 10]
        p.facts["mentor"] = rng.choice(elders).name if elders else None
    return cities, organisations, people


def _passages(rng: random.Random, cities, organisations, people) -> list[tuple[Entity, str, str]]:
    """(entity, role, text) for every passage: a bio and a career passage per person, one per city / organisation."""
    out = []

    def filler() -> str:
        return rng.choice(FILLER)

    for c in cities:
        f = c.facts
        text = rng.choice(
            [
                f"{c.name} is a town in {f['country']} with about {f['population']:,} inhabitants. It was founded in "
                f"{f['founded']} on the banks of the {f['river']}. Visitors come above all for {f['landmark']}.",
                f"Founded in {f['founded']}, {c.name} lies on the {f['river']} in {f['country']}. "
                f"The town is best known for {f['landmark']}, and its population is roughly {f['population']:,}.",
            ]
        )
        out.append((c, "main", f"{text} {filler()}".strip()))
    for o in organisations:
        f = o.facts
        text = rng.choice(
            [
                f"The {o.name} was established in {f['founded']} by {f['founder']}. It has its seat in {f['city']}.",
                f"{f['founder']} set up the {o.name} in {f['founded']}; "
                f"from the start its premises were in {f['city']}.",
                f"Headquartered in {f['city']}, the {o.name} dates from {f['founded']}, when {f['founder']} opened it.",
            ]
        )
        out.append((o, "main", f"{text} {filler()}".strip()))
    for p in people:
        f, they = p.facts, p.facts["pronoun"]
        bio = rng.choice(
            [
                f"{p.name} was born in {f['city']} in {f['born']} and trained as {_a(f['profession'])}.",
                f"Born in {f['born']} in {f['city']}, {p.name} became {_a(f['profession'])} of some renown.",
                f"{p.name}, {_a(f['profession'])}, was a native of {f['city']}, born there in {f['born']}.",
            ]
        )
        mentor = f" {they.capitalize()} learned the trade under {f['mentor']}." if f["mentor"] else ""
        career = rng.choice(
            [
                f"In {f['joined']} {p.name} joined the {f['employer']}, where {they} spent most of {_their(they)} "
                f"working life.{mentor}",
                f"{p.name} worked for the {f['employer']} from {f['joined']} onwards.{mentor}",
            ]
        )
        out.append((p, "bio", f"{bio} {filler()}".strip()))
        out.append((p, "career", f"{career} {filler()}".strip()))
    return out


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _their(pronoun: str) -> str:
    return "her" if pronoun == "she" else "his"


def _questions(rng: random.Random, cities, organisations, people) -> dict[str, list]:
    """Question generators per type; each returns (question, golden answers, gold doc ids) or None.

    The question is a tuple with its text in every phrasing of ``PHRASINGS``, in that order.
    """
    city = {c.name: c for c in cities}
    org = {o.name: o for o in organisations}
    person = {p.name: p for p in people}

    def pick(options):
        return rng.choice(options)

    def phrase(slot: str) -> tuple[str, ...]:
        """One template of ``slot`` in every phrasing (the same index in each); a lone template draws nothing."""
        options = list(zip(*(TEMPLATES[phrasing][slot] for phrasing in PHRASINGS), strict=True))
        return options[0] if len(options) == 1 else rng.choice(options)

    def say(templates: tuple[str, ...], **names: str) -> tuple[str, ...]:
        return tuple(template.format(**names) for template in templates)

    def single():
        kind = rng.randrange(10)
        if kind < 6:
            p = pick(people)
            f = p.facts
            choices = [
                (phrase("person.city"), f["city"], "bio"),
                (phrase("person.born"), str(f["born"]), "bio"),
                (phrase("person.profession"), f["profession"], "bio"),
                (phrase("person.employer"), f["employer"], "career"),
            ]
            if f["mentor"]:
                choices.append((phrase("person.mentor"), f["mentor"], "career"))
            templates, answer, role = pick(choices)
            return say(templates, n=p.name), [answer], [p.doc_ids[role]]
        if kind < 8:
            o = pick(organisations)
            templates, answer = pick(
                [
                    (phrase("org.founded"), str(o.facts["founded"])),
                    (phrase("org.city"), o.facts["city"]),
                    (phrase("org.founder"), o.facts["founder"]),
                ]
            )
            return say(templates, n=o.name), [answer], [o.doc_ids["main"]]
        c = pick(cities)
        templates, answer = pick(
            [
                (phrase("city.river"), c.facts["river"]),
                (phrase("city.country"), c.facts["country"]),
                (phrase("city.landmark"), c.facts["landmark"]),
                (phrase("city.founded"), str(c.facts["founded"])),
            ]
        )
        return say(templates, n=c.name), [answer], [c.doc_ids["main"]]

    def two_hop():
        kind = rng.randrange(6)
        p = pick(people)
        f = p.facts
        employer, home = org[f["employer"]], city[f["city"]]
        if kind == 0:
            return (
                say(phrase("two_hop.employer_founded"), n=p.name),
                [str(employer.facts["founded"])],
                [p.doc_ids["career"], employer.doc_ids["main"]],
            )
        if kind == 1:
            return (
                say(phrase("two_hop.employer_founder"), n=p.name),
                [employer.facts["founder"]],
                [p.doc_ids["career"], employer.doc_ids["main"]],
            )
        if kind == 2:
            return (
                say(phrase("two_hop.home_river"), n=p.name),
                [home.facts["river"]],
                [p.doc_ids["bio"], home.doc_ids["main"]],
            )
        if kind == 3:
            return (
                say(phrase("two_hop.home_country"), n=p.name),
                [home.facts["country"]],
                [p.doc_ids["bio"], home.doc_ids["main"]],
            )
        if kind == 4 and f["mentor"]:
            mentor = person[f["mentor"]]
            return (
                say(phrase("two_hop.mentor_born"), n=p.name),
                [str(mentor.facts["born"])],
                [p.doc_ids["career"], mentor.doc_ids["bio"]],
            )
        o = pick(organisations)
        founder = person[o.facts["founder"]]
        return (
            say(phrase("two_hop.founder_profession"), n=o.name),
            [founder.facts["profession"]],
            [o.doc_ids["main"], founder.doc_ids["bio"]],
        )

    def pair(pool: list[Entity], differ) -> tuple[Entity, Entity] | None:
        """Two entities of ``pool`` (near-duplicates half of the time) for which ``differ`` holds."""
        twins = [e for e in pool if e.twin_of]
        if twins and rng.random() < 0.5:
            a = pick(twins)
            b = {e.name: e for e in pool}[a.twin_of]
        else:
            a, b = rng.sample(pool, 2)
        if not differ(a, b):
            return None
        return (a, b) if rng.random() < 0.5 else (b, a)

    def comparison():
        kind = rng.randrange(4)
        if kind == 0:
            ab = pair(people, lambda a, b: a.facts["born"] != b.facts["born"])
            if ab:
                a, b = ab
                older = min(ab, key=lambda e: e.facts["born"])
                return (
                    say(phrase("comparison.born"), a=a.name, b=b.name),
                    [older.name],
                    [a.doc_ids["bio"], b.doc_ids["bio"]],
                )
        elif kind == 1:
            ab = pair(people, lambda a, b: True)
            if ab:
                a, b = ab
                same = "yes" if a.facts["city"] == b.facts["city"] else "no"
                return (
                    say(phrase("comparison.hometown"), a=a.name, b=b.name),
                    [same],
                    [a.doc_ids["bio"], b.doc_ids["bio"]],
                )
        elif kind == 2:
            ab = pair(organisations, lambda a, b: a.facts["founded"] != b.facts["founded"])
            if ab:
                a, b = ab
                first = min(ab, key=lambda e: e.facts["founded"])
                return (
                    say(phrase("comparison.org_founded"), a=a.name, b=b.name),
                    [first.name],
                    [a.doc_ids["main"], b.doc_ids["main"]],
                )
        else:
            ab = pair(cities, lambda a, b: a.facts["founded"] != b.facts["founded"])
            if ab:
                a, b = ab
                first = min(ab, key=lambda e: e.facts["founded"])
                return (
                    say(phrase("comparison.city_founded"), a=a.name, b=b.name),
                    [first.name],
                    [a.doc_ids["main"], b.doc_ids["main"]],
                )
        return None

    return {"single": single, "two_hop": two_hop, "comparison": comparison}


@dataclass(frozen=True)
class WorldKind:
    """What a kind of world draws: its entities, its passages and its question generators, with the same
    signatures as this module's (the assembly into a corpus and splits, the files and the cache are shared).

    A question generator returns ``(texts per phrasing, golden answers, gold doc ids)``, or with a fourth
    item, the search query per hop that finds each gold passage (``metadata.gold_queries``). A kind with
    ``facts`` (what a question's answer rests on) gets clean splits: every split holds the question types in
    ``TYPE_SHARES``, and the dev and test questions ask each fact once and none that a train question asks.
    """

    name: str
    version: int  # part of the cache directory's key: bump it when the kind's output changes
    sizes: dict[str, WorldSize]  # data.world_size -> size
    entities: Callable[[random.Random, WorldSize], tuple[list[Entity], list[Entity], list[Entity]]]
    passages: Callable[..., list[tuple[Entity, str, str]]]
    questions: Callable[..., dict[str, Callable]]
    facts: Callable[[dict], frozenset[str]] | None = None  # a question row -> the facts it asks


DEFAULT_WORLD = WorldKind(
    "default", GENERATOR_VERSION, {"default": DEFAULT_SIZE, "small": SMALL_SIZE}, _entities, _passages, _questions
)


def _type_counts(total: int) -> dict[str, int]:
    """How many questions of each type ``total`` questions hold (``TYPE_SHARES``, the rounding on single)."""
    counts = {t: round(total * share) for t, share in TYPE_SHARES.items()}
    counts["single"] += total - sum(counts.values())
    return counts


def _check_phrasing(phrasing: str) -> None:
    if phrasing not in PHRASINGS:
        raise ValueError(f"unknown phrasing {phrasing!r}; expected one of {PHRASINGS}")


def generate_world(
    seed: int = 0, size: WorldSize = DEFAULT_SIZE, phrasing: str = "default", kind: WorldKind = DEFAULT_WORLD
) -> World:
    """The ``kind`` world of ``seed`` at ``size`` with questions in ``phrasing``, in memory (same inputs, same
    bytes)."""
    _check_phrasing(phrasing)
    which = PHRASINGS.index(phrasing)
    rng = random.Random(seed)
    cities, organisations, people = kind.entities(rng, size)
    passages = kind.passages(rng, cities, organisations, people)
    rng.shuffle(passages)
    corpus = []
    for row, (entity, role, text) in enumerate(passages):
        entity.doc_ids[role] = str(row)
        corpus.append({"id": str(row), "contents": f'"{entity.name}"\n{text}'})

    generators = kind.questions(rng, cities, organisations, people)
    seen, seen_phrased = set(), set()

    def draw(qtype: str, count: int, barred: set[str], claim: bool) -> list[dict]:
        """``count`` new questions of ``qtype`` asking no fact in ``barred``; ``claim``: their facts join it."""
        out, attempts = [], 0
        while len(out) < count:
            attempts += 1
            if attempts > 50 * count + 100:
                raise RuntimeError(f"could not draw {count} distinct {qtype} questions: enlarge the world")
            drawn = generators[qtype]()
            # Duplicates are judged on the default text, so every phrasing keeps the same questions.
            if drawn is None or drawn[0][0] in seen:
                continue
            texts, answers, gold, *queries = drawn
            metadata = {"type": qtype, "gold_doc_ids": gold, **({"gold_queries": queries[0]} if queries else {})}
            row = {"question": texts[which], "golden_answers": answers, "metadata": metadata}
            facts = kind.facts(row) if kind.facts else frozenset()
            if facts & barred:
                continue
            if row["question"] in seen_phrased:
                raise RuntimeError(f"two {phrasing} templates give the same question {row['question']!r}")
            seen.add(texts[0])
            seen_phrased.add(row["question"])
            if claim:
                barred |= facts
            out.append(row)
        return out

    if kind.facts is None:  # one pool, shuffled into the splits
        total = size.train + size.dev + size.test
        pool = [q for qtype, count in _type_counts(total).items() for q in draw(qtype, count, set(), False)]
        rng.shuffle(pool)
        drawn_splits, start = {}, 0
        for split in SPLITS:
            drawn_splits[split] = pool[start : start + getattr(size, split)]
            start += getattr(size, split)
    else:  # held-out questions first, each claiming its facts, then train questions around them
        held_out: set[str] = set()
        drawn_splits = {}
        for split in ("test", "dev", "train"):
            counts = _type_counts(getattr(size, split))
            rows = [q for qtype, n in counts.items() for q in draw(qtype, n, held_out, split != "train")]
            rng.shuffle(rows)
            drawn_splits[split] = rows
    splits = {s: [{"id": f"{s}-{i:05d}", **q} for i, q in enumerate(drawn_splits[s])] for s in SPLITS}
    return World(corpus, splits, seed, size, phrasing)


def write_world(
    out_dir: str | Path,
    seed: int = 0,
    size: WorldSize = DEFAULT_SIZE,
    phrasing: str = "default",
    overwrite: bool = False,
    kind: WorldKind = DEFAULT_WORLD,
) -> Path:
    """Write ``corpus.jsonl``, the three splits and ``world.json`` (seed, size, counts) into ``out_dir``.

    ``out_dir`` must be new or empty unless ``overwrite``, which replaces the world files there and keeps
    any others. The files are written beside ``out_dir`` and moved in at the end, ``world.json`` last (it
    marks a complete world), so a failure leaves ``out_dir`` as it was. ``world.json`` names the phrasing
    and the kind only when they are not the default (default worlds keep their bytes).
    """
    out_dir = Path(out_dir)
    refuse_taken_folder(
        out_dir, overwrite, "a world", WORLD_INFO, "choose another --out, or pass --overwrite to write over it"
    )
    world = generate_world(seed, size, phrasing, kind)
    parent = out_dir.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.absolute().name}.tmp-", dir=parent))
    try:
        _write_jsonl(staging / "corpus.jsonl", world.corpus)
        for split, rows in world.splits.items():
            _write_jsonl(staging / f"{split}.jsonl", rows)
        info = {
            **({"kind": kind.name} if kind.name != "default" else {}),
            "generator_version": kind.version,
            "seed": seed,
            **({"phrasing": phrasing} if phrasing != "default" else {}),
            "size": asdict(size),
            "passages": len(world.corpus),
            "questions": {s: len(r) for s, r in world.splits.items()},
        }
        (staging / WORLD_INFO).write_text(json.dumps(info, indent=2) + "\n")
        out_dir.mkdir(exist_ok=True)
        (out_dir / WORLD_INFO).unlink(missing_ok=True)  # a half-replaced world is never taken for a whole one
        for name in WORLD_FILES:
            os.replace(staging / name, out_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def world_dir(
    seed: int = 0,
    size: WorldSize = DEFAULT_SIZE,
    root: str | Path | None = None,
    phrasing: str = "default",
    kind: WorldKind = DEFAULT_WORLD,
) -> Path:
    """The ``kind`` world of ``seed``, ``size`` and ``phrasing`` under ``root`` (default: the cache root),
    generated once into ``world-<kind>-v<version>-seed<seed>-<hash>`` (:func:`world_key`).

    Concurrent callers (test workers, actors) generate it once and never see half of it
    (:func:`~bridge_ray.cache.cached_directory`).
    """
    root = Path(root) if root is not None else cache_root()
    return cached_directory(
        root / world_key(seed, size, phrasing, kind), lambda out: write_world(out, seed, size, phrasing, kind=kind)
    )


def world_key(seed: int, size: WorldSize, phrasing: str, kind: WorldKind) -> str:
    """The cache directory's name of a world: :data:`WORLD_KEY` of everything the world is a function of."""
    _check_phrasing(phrasing)
    return WORLD_KEY.of(kind=kind.name, kind_version=kind.version, seed=seed, size=asdict(size), phrasing=phrasing,
                        label=f"{kind.name}-v{kind.version}-seed{seed}")


def default_world_dir() -> Path:
    """The default world (seed 0, default size) in the cache: what the embedded default trains on."""
    return world_dir()


def load_split(directory: str | Path, split: str) -> list[dict]:
    """The questions of one split of a world directory."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    with (Path(directory) / f"{split}.jsonl").open() as f:
        return [json.loads(line) for line in f]
