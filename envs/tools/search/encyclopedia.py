"""A seeded fictional encyclopaedia for the SearchQA env: entities, relations, one article per entity, and one- and
two-hop questions whose answers are only in the articles.

Entities (names made of random syllables, unique, so no model knows them beforehand): countries (official language,
capital), cities (country, founding year, river), organisations (kind, founding year, headquarters city) and people
(profession, birth year, birth city, employer). Each entity has one article in the FlashRAG/Wikipedia-dump form
``'"Title"\\n<text>'``; an article names only the entity's direct relations, so a two-hop question ("In which
country was X born?") needs the person's article (birth city) and then the city's (country).

A question records the chain of entities whose articles answer it (``chain``): the expert searches them in order and
then answers. Everything is drawn from one ``numpy`` generator seeded by ``world_seed``, so a seed always builds the
same world.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "tr",
    "th",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "nd")
PROFESSIONS = (
    "painter",
    "engineer",
    "chemist",
    "poet",
    "architect",
    "botanist",
    "cartographer",
    "composer",
    "astronomer",
    "physician",
    "sculptor",
    "historian",
)
ORG_KINDS = (
    "Guild",
    "Company",
    "University",
    "Orchestra",
    "Observatory",
    "Library",
    "Institute",
    "Foundry",
)


@dataclass(frozen=True)
class Article:
    id: str
    title: str
    contents: str


@dataclass(frozen=True)
class Question:
    """A question, its answer and the entities whose articles lead to it, in search order."""

    text: str
    answer: str
    chain: tuple[str, ...]
    facts: tuple[str, ...]  # per chain entity, the fact its article gives ("X was born in Y")


@dataclass(frozen=True)
class World:
    articles: tuple[Article, ...]
    countries: tuple[dict, ...]
    cities: tuple[dict, ...]
    orgs: tuple[dict, ...]
    people: tuple[dict, ...]

    def documents(self) -> tuple[tuple[str, str], ...]:
        """``(id, contents)`` pairs, the retriever's corpus."""
        return tuple((a.id, a.contents) for a in self.articles)


def _name(rng: np.random.Generator, syllables: tuple[int, int]) -> str:
    n = int(rng.integers(syllables[0], syllables[1] + 1))
    parts = [
        _ONSETS[int(rng.integers(len(_ONSETS)))] + _VOWELS[int(rng.integers(len(_VOWELS)))]
        for _ in range(n)
    ]
    return ("".join(parts) + _CODAS[int(rng.integers(len(_CODAS)))]).capitalize()


def _unique_names(
    rng: np.random.Generator, count: int, syllables: tuple[int, int], taken: set[str]
) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = _name(rng, syllables)
        if name.lower() not in taken:
            taken.add(name.lower())
            names.append(name)
    return names


def build_world(
    world_seed: int = 0,
    num_people: int = 48,
    num_cities: int = 16,
    num_countries: int = 5,
    num_orgs: int = 10,
) -> World:
    """The encyclopaedia of ``world_seed`` (see the module docstring)."""
    if num_countries < 1 or num_cities < num_countries or num_orgs < 1 or num_people < 1:
        raise ValueError(
            f"need 1 <= num_countries <= num_cities, num_orgs >= 1, num_people >= 1; got "
            f"{num_countries}, {num_cities}, {num_orgs}, {num_people}"
        )
    rng = np.random.default_rng(world_seed)
    # every name first, in this order, from one pool: no two entities share a name
    taken: set[str] = set()
    country_names = _unique_names(rng, num_countries, (2, 3), taken)
    languages = [n + "ic" for n in _unique_names(rng, num_countries, (2, 2), taken)]
    city_names = _unique_names(rng, num_cities, (2, 3), taken)
    rivers = _unique_names(rng, num_cities, (2, 2), taken)
    org_stems = _unique_names(rng, num_orgs, (2, 3), taken)
    firsts = _unique_names(rng, num_people, (2, 2), taken)
    lasts = _unique_names(rng, num_people, (2, 3), taken)

    # country i's capital is city i (every country has a city)
    countries = [
        {"name": name, "language": languages[i], "capital": i}
        for i, name in enumerate(country_names)
    ]
    cities = _draw_cities(rng, city_names, rivers, num_countries)
    orgs = _draw_orgs(rng, org_stems, num_cities)
    people = _draw_people(rng, firsts, lasts, num_cities, num_orgs)
    articles = _write_articles(countries, cities, orgs, people)
    return World(tuple(articles), tuple(countries), tuple(cities), tuple(orgs), tuple(people))


def _draw_cities(
    rng: np.random.Generator, names: list[str], rivers: list[str], num_countries: int
) -> list[dict]:
    """One city per name, on the river of the same index: the first ``num_countries`` cities are
    in countries 0, 1, ... (their capitals), the others in a random country."""
    cities = []
    for i, name in enumerate(names):
        # every country has a city
        country = i if i < num_countries else int(rng.integers(num_countries))
        # founded before anyone was born (1850-1999), so a birth year never equals a founding year
        # by chance
        cities.append(
            {
                "name": name,
                "country": country,
                "founded": int(rng.integers(700, 1800)),
                "river": rivers[i],
            }
        )
    return cities


def _draw_orgs(rng: np.random.Generator, stems: list[str], num_cities: int) -> list[dict]:
    """One organisation per name stem: a kind (the name's last word), a founding year and a
    headquarters city."""
    orgs = []
    for stem in stems:
        kind = ORG_KINDS[int(rng.integers(len(ORG_KINDS)))]
        orgs.append(
            {
                "name": f"{stem} {kind}",
                "kind": kind.lower(),
                "founded": int(rng.integers(1600, 1990)),
                "city": int(rng.integers(num_cities)),
            }
        )
    return orgs


def _draw_people(
    rng: np.random.Generator,
    firsts: list[str],
    lasts: list[str],
    num_cities: int,
    num_orgs: int,
) -> list[dict]:
    """One person per first and last name: a profession, a birth year, a birth city and an
    employer."""
    people = []
    for first, last in zip(firsts, lasts):
        people.append(
            {
                "name": f"{first} {last}",
                "last": last,
                "profession": PROFESSIONS[int(rng.integers(len(PROFESSIONS)))],
                "born": int(rng.integers(1850, 2000)),
                "city": int(rng.integers(num_cities)),
                "org": int(rng.integers(num_orgs)),
            }
        )
    return people


def _write_articles(
    countries: list[dict], cities: list[dict], orgs: list[dict], people: list[dict]
) -> list[Article]:
    """One article per entity (countries, cities, organisations, people, in that order, ids
    ``doc_0``, ``doc_1``, ...), naming only the entity's direct relations."""
    articles: list[Article] = []

    def add(title: str, text: str) -> None:
        articles.append(Article(f"doc_{len(articles)}", title, f'"{title}"\n{text}'))

    for c in countries:
        add(
            c["name"],
            f"{c['name']} is a country whose official language is {c['language']}. "
            f"Its capital is {cities[c['capital']]['name']}.",
        )
    for c in cities:
        add(
            c["name"],
            f"{c['name']} is a city in {countries[c['country']]['name']}. It was founded in "
            f"{c['founded']} on the river {c['river']}.",
        )
    for o in orgs:
        add(
            o["name"],
            f"The {o['name']} is a {o['kind']} founded in {o['founded']}. Its headquarters are in "
            f"{cities[o['city']]['name']}.",
        )
    for p in people:
        add(
            p["name"],
            f"{p['name']} is a {p['profession']} born in {p['born']} in {cities[p['city']]['name']}. "
            f"{p['last']} works for the {orgs[p['org']]['name']}.",
        )
    return articles


def draw_question(
    world: World, rng: np.random.Generator, hops: tuple[int, ...] = (1, 2)
) -> Question:
    """A question about ``world``: the hop count uniform over ``hops``, then a template and its
    subject uniformly."""
    h = int(hops[int(rng.integers(len(hops)))])
    templates = _ONE_HOP if h == 1 else _TWO_HOP
    return templates[int(rng.integers(len(templates)))](world, rng)


def _pick(items: tuple[dict, ...], rng: np.random.Generator) -> dict:
    return items[int(rng.integers(len(items)))]


def _person_city(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    city = w.cities[p["city"]]["name"]
    return Question(
        f"In which city was {p['name']} born?",
        city,
        (p["name"],),
        (f"{p['name']} was born in {city}",),
    )


def _person_org(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    org = w.orgs[p["org"]]["name"]
    return Question(
        f"Which organization does {p['name']} work for?",
        org,
        (p["name"],),
        (f"{p['name']} works for the {org}",),
    )


def _person_year(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    return Question(
        f"In which year was {p['name']} born?",
        str(p["born"]),
        (p["name"],),
        (f"{p['name']} was born in {p['born']}",),
    )


def _person_job(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    return Question(
        f"What is the profession of {p['name']}?",
        p["profession"],
        (p["name"],),
        (f"{p['name']} is a {p['profession']}",),
    )


def _city_country(w: World, r: np.random.Generator) -> Question:
    c = _pick(w.cities, r)
    country = w.countries[c["country"]]["name"]
    return Question(
        f"In which country is {c['name']}?",
        country,
        (c["name"],),
        (f"{c['name']} is in {country}",),
    )


def _city_year(w: World, r: np.random.Generator) -> Question:
    c = _pick(w.cities, r)
    return Question(
        f"In which year was {c['name']} founded?",
        str(c["founded"]),
        (c["name"],),
        (f"{c['name']} was founded in {c['founded']}",),
    )


def _org_city(w: World, r: np.random.Generator) -> Question:
    o = _pick(w.orgs, r)
    city = w.cities[o["city"]]["name"]
    return Question(
        f"In which city are the headquarters of the {o['name']}?",
        city,
        (o["name"],),
        (f"the {o['name']} is in {city}",),
    )


def _country_capital(w: World, r: np.random.Generator) -> Question:
    k = _pick(w.countries, r)
    capital = w.cities[k["capital"]]["name"]
    return Question(
        f"What is the capital of {k['name']}?",
        capital,
        (k["name"],),
        (f"the capital of {k['name']} is {capital}",),
    )


def _country_language(w: World, r: np.random.Generator) -> Question:
    k = _pick(w.countries, r)
    return Question(
        f"What is the official language of {k['name']}?",
        k["language"],
        (k["name"],),
        (f"{k['name']} speaks {k['language']}",),
    )


def _person_country(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    city = w.cities[p["city"]]
    country = w.countries[city["country"]]["name"]
    return Question(
        f"In which country was {p['name']} born?",
        country,
        (p["name"], city["name"]),
        (f"{p['name']} was born in {city['name']}", f"{city['name']} is in {country}"),
    )


def _person_city_year(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    city = w.cities[p["city"]]
    return Question(
        f"In which year was the city where {p['name']} was born founded?",
        str(city["founded"]),
        (p["name"], city["name"]),
        (
            f"{p['name']} was born in {city['name']}",
            f"{city['name']} was founded in {city['founded']}",
        ),
    )


def _person_org_city(w: World, r: np.random.Generator) -> Question:
    p = _pick(w.people, r)
    org = w.orgs[p["org"]]
    city = w.cities[org["city"]]["name"]
    return Question(
        f"In which city are the headquarters of the organization {p['name']} works for?",
        city,
        (p["name"], org["name"]),
        (f"{p['name']} works for the {org['name']}", f"the {org['name']} is in {city}"),
    )


def _org_country(w: World, r: np.random.Generator) -> Question:
    o = _pick(w.orgs, r)
    city = w.cities[o["city"]]
    country = w.countries[city["country"]]["name"]
    return Question(
        f"In which country are the headquarters of the {o['name']}?",
        country,
        (o["name"], city["name"]),
        (f"the {o['name']} is in {city['name']}", f"{city['name']} is in {country}"),
    )


def _city_language(w: World, r: np.random.Generator) -> Question:
    # not a capital: a capital's name is in its country's article, which a search for the city would
    # also find
    capitals = {k["capital"] for k in w.countries}
    c = _pick(tuple(c for i, c in enumerate(w.cities) if i not in capitals) or w.cities, r)
    k = w.countries[c["country"]]
    return Question(
        f"What is the official language of the country where {c['name']} lies?",
        k["language"],
        (c["name"], k["name"]),
        (f"{c['name']} is in {k['name']}", f"{k['name']} speaks {k['language']}"),
    )


_ONE_HOP = (
    _person_city,
    _person_org,
    _person_year,
    _person_job,
    _city_country,
    _city_year,
    _org_city,
    _country_capital,
    _country_language,
)
_TWO_HOP = (_person_country, _person_city_year, _person_org_city, _org_country, _city_language)
