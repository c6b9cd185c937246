"""How a reading that could not be taken is recorded (a marker with the reason, never an exception), and the
sysfs reads that make one: the vocabulary every hardware reader (discovery, gpu, placement) shares, as nvitop's
NA."""

from __future__ import annotations

from pathlib import Path


def unavailable(reason: str) -> dict:
    return {"unavailable": reason}


def is_unavailable(value) -> bool:
    return isinstance(value, dict) and set(value) == {"unavailable"}


def read_text(path: Path) -> str | dict:
    """A sysfs/procfs attribute's text, or the unavailable marker saying why not."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return unavailable(f"{path} does not exist")
    except OSError as exc:
        return unavailable(f"{path}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        return unavailable(f"{path} is not text")


def read_int(path: Path, base: int = 10) -> int | dict:
    text = read_text(path)
    if not isinstance(text, str):  # unavailable, with its reason
        return text
    try:
        return int(text, base)
    except ValueError:
        return unavailable(f"{path} holds {text[:40]!r}, not a number")
