#!/usr/bin/env python3
"""Build Search-v0's shipped corpus and questions from WordNet 3.0 (Debian's ``wordnet-base``).

    apt-get install wordnet-base
    .venv/bin/python scripts/build_search_corpus.py [--wordnet /usr/share/wordnet]
        [--out agentrl/envs/search/data]

Writes ``wordnet_corpus.jsonl`` (Search-R1's corpus layout: ``id``, and ``contents`` whose first
line is the title) and ``wordnet_questions.jsonl`` (FlashRAG's layout: ``id``, ``question``,
``golden_answers``, ``metadata``). The output depends only on WordNet's files: running it again
gives the same bytes (a test checks this where ``wordnet-base`` is installed).

**Corpus.** One passage per noun synset that is an instance (Paris, Albert Einstein, the Nile:
7,730 in WordNet 3.0) and per class those instances belong to (city, physicist): its gloss,
its other names, and its relations written out as sentences (instance of / kind of, part of,
member of, its parts, a few of its instances).

**Questions**, each checked when built: the evidence passage of every hop exists and the answer
is in the last one; the question does not contain the answer; for two hops, the bridge entity is
in the first hop's passage and the answer is not (so one search cannot answer it).

- ``country`` (1 hop): "Which country is Lyon in?"
- ``capital`` (1 hop): "What is the capital of Peru?"
- ``person`` (1 hop): "Who is this: physicist born in Germany who formulated ... (1879-1955)?"
- ``capital_of_country`` (2 hops): "What is the capital of the country that Arequipa is in?"
  (Arequipa -> Peru -> Lima)
- ``continent_of_country`` (2 hops): "Which continent is the country with the capital Lima
  in?" (Lima -> Peru -> South America)

``metadata`` has the question's ``type``, ``hops``, ``bridge`` (the entity the first hop finds),
``subquestions`` (one question per hop, the second naming the bridge) and ``evidence`` (per hop,
the ids of the passages that answer its subquestion).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from agentrl.envs.search.qa import normalize_answer

NATIONAL_CAPITAL = "08691669"
CITY_KINDS = {"city", "town", "port", "state_capital", "provincial_capital", "port_of_entry"}
COUNTRY_KIND = re.compile(r"(^|_)(country|nation)$", re.IGNORECASE)
MAX_LISTED = 12
COUNTS = {
    "country": 40,
    "capital": 30,
    "person": 40,
    "capital_of_country": 35,
    "continent_of_country": 35,
}
SEED = 15


@dataclass
class Synset:
    offset: str
    words: list[str]
    gloss: str
    pointers: list[tuple[str, str]] = field(default_factory=list)  # (symbol, target offset)

    @property
    def names(self) -> list[str]:
        return [word.replace("_", " ") for word in self.words]

    @property
    def title(self) -> str:
        return self.names[0]

    @property
    def id(self) -> str:
        return f"wn30-n{self.offset}"

    def targets(self, symbol: str) -> list[str]:
        return [target for sym, target in self.pointers if sym == symbol]


def read_nouns(wordnet: Path) -> dict[str, Synset]:
    """Parse ``data.noun`` (format: wndb(5WN)); only noun-to-noun pointers are kept."""
    synsets = {}
    with open(wordnet / "data.noun", encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("  "):  # the license header
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            offset, count = fields[0], int(fields[3], 16)
            words = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]) for i in range(count)]
            at = 4 + 2 * count
            pointers = []
            for _ in range(int(fields[at])):
                symbol, target, pos = fields[at + 1], fields[at + 2], fields[at + 3]
                if pos == "n":
                    pointers.append((symbol, target))
                at += 4
            synsets[offset] = Synset(offset, words, gloss.strip(), pointers)
    return synsets


class Builder:
    def __init__(self, synsets: dict[str, Synset]):
        self.synsets = synsets
        self.instances = sorted(o for o, s in synsets.items() if s.targets("@i"))
        classes = {k for o in self.instances for k in synsets[o].targets("@i")}
        self.selected = sorted(set(self.instances) | classes)
        titles = Counter(synsets[o].title.lower() for o in self.selected)
        self.unique = {o for o in self.selected if titles[synsets[o].title.lower()] == 1}
        self.passages = {o: self.passage(synsets[o]) for o in self.selected}
        self.capitals: dict[str, list[str]] = {}
        for o in self.instances:
            if NATIONAL_CAPITAL in synsets[o].targets("@i"):
                for holonym in synsets[o].targets("#p"):
                    self.capitals.setdefault(holonym, []).append(o)

    def kinds(self, offset: str) -> list[str]:
        return [self.synsets[k].words[0] for k in self.synsets[offset].targets("@i")]

    def names(self, offsets: list[str]) -> list[str]:
        return sorted({self.synsets[o].title for o in offsets})

    def passage(self, synset: Synset) -> str:
        title = synset.title
        sentences = [f"{title}: {synset.gloss.rstrip(' ;.')}."]
        if len(synset.names) > 1:
            sentences.append(f"Also called {self.listing(synset.names[1:])}.")
        relations = [
            ("@i", f"{title} is an instance of {{}}."),
            ("@", f"{title} is a kind of {{}}."),
            ("#p", f"{title} is part of {{}}."),
            ("#m", f"{title} is a member of {{}}."),
            ("%p", f"Parts of {title}: {{}}."),
            ("~i", f"Instances of {title}: {{}}."),
        ]
        for symbol, sentence in relations:
            names = self.names(synset.targets(symbol))
            if names:
                sentences.append(sentence.format(self.listing(names)))
        return f"{title}\n{' '.join(sentences)}"

    @staticmethod
    def listing(names: list[str]) -> str:
        more = len(names) - MAX_LISTED
        listed = ", ".join(names[:MAX_LISTED])
        return f"{listed} and {more} more" if more > 0 else listed

    # --- relations the questions use --------------------------------------------------------

    def is_country(self, offset: str) -> bool:
        return any(COUNTRY_KIND.search(kind) for kind in self.kinds(offset))

    def countries_of(self, offset: str) -> list[str]:
        return [h for h in self.synsets[offset].targets("#p") if self.is_country(h)]

    def capitals_of(self, country: str) -> list[str]:
        return self.capitals.get(country, [])

    def continents_of(self, country: str) -> list[str]:
        return [h for h in self.synsets[country].targets("#p") if "continent" in self.kinds(h)]

    # --- questions ----------------------------------------------------------------------------

    def candidates(self) -> dict[str, list[dict]]:
        found: dict[str, list[dict | None]] = {kind: [] for kind in COUNTS}
        persons = Counter(self.person_clue(o) for o in self.instances)
        for o in self.instances:
            if o not in self.unique:
                continue
            synset, title = self.synsets[o], self.synsets[o].title
            countries = self.countries_of(o)
            country = countries[0] if len(countries) == 1 else None
            capitals = self.capitals_of(country) if country else []
            capital = capitals[0] if len(capitals) == 1 else None
            if set(self.kinds(o)) & CITY_KINDS and country:
                in_country = f"Which country is {title} in?"
                found["country"].append(self.question("country", [in_country], [[o]], country))
                if capital and capital != o:
                    of_country = f"What is the capital of {self.synsets[country].title}?"
                    found["capital_of_country"].append(
                        self.question(
                            "capital_of_country",
                            [in_country, of_country],
                            [[o], [capital]],
                            capital,
                            bridge=country,
                            question=f"What is the capital of the country that {title} is in?",
                        )
                    )
            own_capitals = self.capitals_of(o) if self.is_country(o) else []
            if len(own_capitals) == 1:
                found["capital"].append(
                    self.question(
                        "capital",
                        [f"What is the capital of {title}?"],
                        [own_capitals],
                        own_capitals[0],
                    )
                )
            continents = self.continents_of(country) if country else []
            if NATIONAL_CAPITAL in synset.targets("@i") and len(continents) == 1:
                found["continent_of_country"].append(
                    self.question(
                        "continent_of_country",
                        [
                            f"Which country has the capital {title}?",
                            f"Which continent is {self.synsets[country].title} in?",
                        ],
                        [[o], [country]],
                        continents[0],
                        bridge=country,
                        question=f"Which continent is the country with the capital {title} in?",
                    )
                )
            clue = self.person_clue(o)
            if clue and persons[clue] == 1:
                found["person"].append(self.question("person", [f"Who is this: {clue}?"], [[o]], o))
        return {kind: [q for q in rows if q is not None] for kind, rows in found.items()}

    def person_clue(self, offset: str) -> str | None:
        """The first clause of a person's gloss and their dates, if it does not name them."""
        synset = self.synsets[offset]
        if "person" not in {self.synsets[k].words[0] for k in self.ancestors(offset)}:
            return None
        clause = synset.gloss.split(";")[0].strip()
        dates = re.search(r"\(\d[^()]*\d\)\s*$", synset.gloss)
        if dates and dates.group(0) not in clause:
            clause = f"{clause} {dates.group(0).strip()}"
        name_words = {w for name in synset.names for w in normalize_answer(name).split()}
        if len(clause.split()) < 5 or name_words & set(normalize_answer(clause).split()):
            return None
        return clause

    def ancestors(self, offset: str) -> set[str]:
        seen, todo = set(), [offset]
        while todo:
            for parent in self.synsets[todo.pop()].pointers:
                if parent[0] in ("@", "@i") and parent[1] not in seen:
                    seen.add(parent[1])
                    todo.append(parent[1])
        return seen

    def question(
        self,
        kind: str,
        subquestions: list[str],
        evidence: list[list[str]],
        answer: str,
        *,
        bridge: str | None = None,
        question: str | None = None,
    ) -> dict | None:
        """The question's row, or None when it fails a check (see the module docstring)."""
        text = question or subquestions[0]
        answers = self.synsets[answer].names
        normalized = [normalize_answer(a) for a in answers]
        if any(f" {a} " in f" {normalize_answer(text)} " for a in normalized):
            return None
        last = normalize_answer(" ".join(self.passages[o] for o in evidence[-1]))
        if not any(f" {a} " in f" {last} " for a in normalized):
            return None
        if bridge is not None:
            first = f" {normalize_answer(self.passages[evidence[0][0]])} "
            if f" {normalize_answer(self.synsets[bridge].title)} " not in first:
                return None
            if any(f" {a} " in first for a in normalized):
                return None
        return {
            "question": text,
            "golden_answers": answers,
            "metadata": {
                "type": kind,
                "hops": len(evidence),
                "bridge": self.synsets[bridge].title if bridge else None,
                "subquestions": subquestions,
                "evidence": [[self.synsets[o].id for o in hop] for hop in evidence],
            },
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"))
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parents[1] / "agentrl/envs/search/data"
    )
    args = parser.parse_args()
    if not (args.wordnet / "data.noun").is_file():
        print(f"no WordNet at {args.wordnet}: apt-get install wordnet-base", file=sys.stderr)
        return 2
    builder = Builder(read_nouns(args.wordnet))
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "wordnet_corpus.jsonl", "w", encoding="utf-8") as out:
        for offset in builder.selected:
            row = {"id": builder.synsets[offset].id, "contents": builder.passages[offset]}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    rng = random.Random(SEED)
    candidates = builder.candidates()
    rows = []
    for kind, count in COUNTS.items():
        pool = candidates[kind]
        if len(pool) < count:
            raise SystemExit(f"only {len(pool)} {kind} questions pass the checks; {count} wanted")
        rows += rng.sample(pool, count)
    rng.shuffle(rows)
    with open(args.out / "wordnet_questions.jsonl", "w", encoding="utf-8") as out:
        for number, row in enumerate(rows):
            out.write(json.dumps({"id": f"wn-q{number:03d}", **row}, ensure_ascii=False) + "\n")
    print(
        f"{len(builder.selected)} passages, {len(rows)} questions "
        f"({sum(r['metadata']['hops'] == 2 for r in rows)} with two hops) in {args.out}; "
        f"candidates: {', '.join(f'{k} {len(v)}' for k, v in candidates.items())}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
