"""The built-in `demo` corpus: deterministic, seeded children's stories.

The stories are simple on purpose. Names, pronouns, places and objects recur inside a story, every
problem has a cause and a fix, and dialogue sits in quotes, so even a 10K-parameter model learns
visible structure (names agree with pronouns, "sad" comes before help, "happy" after it) with no
external text. The same seed always gives the same stories, byte for byte.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Iterator

DEMO_STORIES = 12000  # about 5.6 MB of text with the default seed
DEMO_SEED = 1234


@dataclass(frozen=True)
class Character:
    """One story character: a name, what it is, and its pronouns."""

    name: str
    kind: str
    he: str  # subject pronoun
    his: str  # possessive
    him: str  # object


def _chars(names: str, kind: str, he: str, his: str, him: str) -> list[Character]:
    return [Character(n, kind, he, his, him) for n in names.split()]


CHARACTERS = (
    _chars("Lily Mia Anna Sara Emma Rose Lucy Zoe Ella Ivy", "little girl", "she", "her", "her")
    + _chars("Tom Ben Max Sam Leo Jack Finn Noah Eli Ted", "little boy", "he", "his", "him")
    + _chars("Spot Rex Buddy Bingo", "happy dog", "he", "his", "him")
    + _chars("Kitty Misty Luna", "small cat", "she", "her", "her")
    + _chars("Pip Tweet Sky", "tiny bird", "he", "his", "him")
    + _chars("Hoppy Fluff", "soft bunny", "she", "her", "her")
    + _chars("Bear Bruno", "big bear", "he", "his", "him")
)
PLACES = ("park", "forest", "beach", "garden", "farm", "kitchen", "school", "river", "hill",
          "library", "market", "pond", "meadow", "playground", "zoo", "house")
OBJECTS = ("ball", "kite", "red hat", "blue boat", "toy car", "book", "drum", "shell", "doll",
           "yellow truck", "teddy bear", "balloon", "little train", "green cup", "crayon", "flower")
FOODS = ("apple", "cookie", "banana", "sandwich", "cake", "carrot", "pear", "bowl of soup")
GOOD = ("happy", "glad", "proud", "calm", "excited")
BAD = ("sad", "scared", "angry", "worried", "lonely")
WEATHER = (("rain", "wet", "an umbrella"), ("snow", "cold", "a warm coat"),
           ("wind", "cold", "a big scarf"), ("sun", "hot", "a sun hat"))
ENDINGS = (
    "From that day on, {a} and {b} were best friends.",
    "{a} learned that it is good to share.",
    "{a} learned that friends help each other.",
    "And they all lived happily ever after.",
    "That night, {a} went to bed with a big smile.",
    "{a} said, \"Thank you, {b}!\" and gave {b2} a hug.",
)


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _lost(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    obj, spot = r.choice(OBJECTS), r.choice(("under the bed", "behind a tree", "in the grass",
                                             "under a big rock", "in a box", "near the water"))
    bad = r.choice(("sad", "worried"))
    return [
        f"{a.name} had a {obj}. {_cap(a.he)} loved {a.his} {obj} very much.",
        f"One day, {a.name} went to the {place}, but the {obj} was gone!",
        f"{a.name} felt {bad} because {a.he} could not find {a.his} {obj}.",
        f"{b.name} saw {a.name} and asked, \"Why are you {bad}, {a.name}?\"",
        f"\"I lost my {obj},\" said {a.name}.",
        f"\"I will help you look,\" said {b.name}.",
        f"They looked and looked. At last, {b.name} found the {obj} {spot}.",
        f"{a.name} was so {r.choice(GOOD)}. {_cap(a.he)} had {a.his} {obj} again.",
    ]


def _share(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    food = r.choice(FOODS)
    return [
        f"{a.name} went to the {place} with a big {food}.",
        f"{b.name} was there too, and {b.he} was very hungry.",
        f"{b.name} looked at the {food} and said, \"I am so hungry. Can I have some?\"",
        f"At first, {a.name} did not want to share. {_cap(a.he)} wanted the {food} for {a.him}self.",
        f"Then {a.name} saw that {b.name} was {r.choice(('sad', 'lonely'))}.",
        f"So {a.name} gave half of the {food} to {b.name}.",
        f"{b.name} smiled and said, \"Thank you, {a.name}! You are kind.\"",
        f"Because {a.name} shared, they were both {r.choice(GOOD)}.",
    ]


def _weather(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    weather, feel, gear = r.choice(WEATHER)
    obj = r.choice(OBJECTS)
    return [
        f"{a.name} wanted to play with {a.his} {obj} at the {place}.",
        f"But then the {weather} came, and {a.name} felt {feel}.",
        f"\"Oh no,\" said {a.name}. \"I can not play now.\"",
        f"{b.name} came with {gear}. \"Take this,\" {b.he} said.",
        f"Because {a.name} had {gear}, {a.he} was not {feel} anymore.",
        f"{a.name} and {b.name} played with the {obj} all day.",
    ]


def _scared(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    thing = r.choice(("a loud noise", "a big shadow", "the dark", "a strange sound"))
    cause = {"a loud noise": "It was only a drum.", "a big shadow": "It was only a tree.",
             "the dark": "It was only the night.", "a strange sound": "It was only the wind."}[thing]
    return [
        f"One night, {a.name} was at the {place}.",
        f"{_cap(a.he)} heard {thing} and felt scared." if thing != "the dark"
        else f"It was very dark, and {a.name} felt scared.",
        f"{a.name} called, \"{b.name}, please help me!\"",
        f"{b.name} came with a little lamp. The light was warm and bright.",
        f"\"Look,\" said {b.name}. \"{cause}\"",
        f"{a.name} was not scared anymore. {_cap(a.he)} felt {r.choice(('calm', 'safe', 'happy'))}.",
    ]


def _broken(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    obj = r.choice(OBJECTS)
    how = r.choice(("fell down", "hit a rock", "got stuck in a tree", "fell in the water"))
    fix = r.choice(("some glue", "a long stick", "a piece of string", "a little hammer"))
    return [
        f"{a.name} and {b.name} played with a {obj} at the {place}.",
        f"Then the {obj} {how}, and it broke.",
        f"{a.name} started to cry. \"My {obj} is broken!\" {a.he} said.",
        f"{b.name} had an idea. {_cap(b.he)} got {fix}.",
        f"{b.name} used {fix} to fix the {obj}.",
        f"Now the {obj} was as good as new, so {a.name} was {r.choice(GOOD)} again.",
    ]


def _race(r: random.Random, a: Character, b: Character, place: str) -> list[str]:
    winner, loser = (a, b) if r.random() < 0.5 else (b, a)
    return [
        f"{a.name} and {b.name} had a race at the {place}.",
        f"\"Ready, set, go!\" said {a.name}, and they ran as fast as they could.",
        f"{winner.name} ran very fast and won the race.",
        f"{loser.name} felt {r.choice(('sad', 'angry'))} because {loser.he} lost.",
        f"{winner.name} said, \"You ran well, {loser.name}. Let us race again tomorrow.\"",
        f"{loser.name} smiled. It is fun to play, even when you do not win.",
    ]


PLOTS: tuple[Callable[[random.Random, Character, Character, str], list[str]], ...] = (
    _lost, _share, _weather, _scared, _broken, _race)


def story(r: random.Random) -> str:
    """One story: an opening, one plot with a problem and its fix, and an ending."""
    a, b = r.sample(CHARACTERS, 2)
    place = r.choice(PLACES)
    opening = r.choice((
        f"Once upon a time, there was a {a.kind} named {a.name}.",
        f"There was once a {a.kind} called {a.name}.",
        f"{a.name} was a {a.kind} who lived near the {place}.",
    ))
    friend = f"{a.name} had a friend named {b.name}. {b.name} was a {b.kind}."
    ending = r.choice(ENDINGS).format(a=a.name, b=b.name, b2=b.him)
    return " ".join([opening, friend, *r.choice(PLOTS)(r, a, b, place), ending])


def generate_stories(num_stories: int = DEMO_STORIES, seed: int = DEMO_SEED) -> Iterator[str]:
    """Yield `num_stories` stories; the same seed always gives the same text."""
    r = random.Random(seed)
    for _ in range(num_stories):
        yield story(r)
