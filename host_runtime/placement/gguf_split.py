"""A split GGUF's parts (pure): llama.cpp's gguf-split and the `gguf` package write a large model as
PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf, the metadata in the first, each part's own tensors in
it, and llama.cpp loads the set from the first part's path, finding the others beside it by that naming
(llama_split_path). So the box keeps a split model's parts under those names and reads its table from all of
them."""

from __future__ import annotations

import re
from pathlib import PurePath

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

SPLIT_COUNT = "split.count"           # in every part: how many there are
SPLIT_NO = "split.no"                 # in every part: its index, from 0
SPLIT_TENSORS = "split.tensors.count"  # in every part: the tensors of all parts together


def split_of(name: str) -> tuple[int, int] | None:
    """(the part's number from 1, how many parts) where a file's name says it is one part of several; else None
    (a single file, or "-00001-of-00001")."""
    m = SPLIT.search(PurePath(name).name)
    if m is None or int(m.group(2)) < 2 or not 1 <= int(m.group(1)) <= int(m.group(2)):
        return None
    return int(m.group(1)), int(m.group(2))


def set_stem(name: str) -> str:
    """A GGUF file's name without .gguf, and without -00001-of-0000N where it is one part of a set."""
    name = SPLIT.sub(".gguf", PurePath(name).name)
    return name[:-len(".gguf")] if name.lower().endswith(".gguf") else name


def part_name(first: str, number: int, count: int) -> str:
    """Part `number` (from 1) of a set of `count` whose first part is named `first` (a file name, a path or a
    URL: only the ending changes), as llama.cpp's llama_split_path names it."""
    return SPLIT.sub(f"-{number:05d}-of-{count:05d}.gguf", first)


def part_names(first: str) -> list[str]:
    """Every part's name, the first included, where `first` names the first part of a set; [first] otherwise
    (a single file, or a later part: a set is named by its first)."""
    split = split_of(first)
    if split is None or split[0] != 1:
        return [first]
    return [part_name(first, k, split[1]) for k in range(1, split[1] + 1)]


def store_names(name: str, count: int) -> list[str]:
    """The files a store model called `name` keeps its parts in (one: NAME.gguf)."""
    if count < 2:
        return [f"{name}.gguf"]
    return [f"{name}-{k:05d}-of-{count:05d}.gguf" for k in range(1, count + 1)]
