"""Long multi-session conversations (LoCoMo, read from ``../shared/data/locomo-dev``).

Every turn becomes one episode: its text prefixed with the speaker's name (and the caption of a
shared photo), dated by its session (turns one second apart, so they keep their order), in the
task run of its session. Questions of category 5 (adversarial: no answer in the dialogue) are
left out, as is usual. Nothing here is copied into the repository; where the folder is absent
:func:`load_conversations` returns ``None`` and says why.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

_HERE = Path(__file__).resolve().parent
_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+(\w+),?\s+(\d{4})", re.I)


@dataclass(frozen=True)
class Turn:
    dia_id: str
    content: str
    at: datetime
    session: str


@dataclass(frozen=True)
class Question:
    text: str
    evidence: frozenset[str]
    category: int


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: list[Turn]
    questions: list[Question]


def data_dir() -> Path:
    env = os.environ.get("BENCH_LOCOMO_DIR")
    if env:
        return Path(env)
    return _HERE.parent.parent / "shared" / "data" / "locomo-dev"


def _session_date(text: str) -> datetime:
    match = _DATE.search(text)
    if match is None:
        raise ValueError(f"unreadable session date {text!r}")
    hour, minute, half, day, month, year = match.groups()
    hour_24 = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    parsed = datetime.strptime(f"{day} {month} {year}", "%d %B %Y")
    return parsed.replace(hour=hour_24, minute=int(minute), tzinfo=UTC)


def _load(path: Path) -> Conversation:
    data = orjson.loads(path.read_bytes())
    turns: list[Turn] = []
    numbers = sorted(
        int(key.split("_")[1])
        for key, value in data.items()
        if re.fullmatch(r"session_\d+", key) and isinstance(value, list) and value
    )
    for number in numbers:
        start = _session_date(str(data[f"session_{number}_date_time"]))
        for n, turn in enumerate(data[f"session_{number}"]):
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares {turn['blip_caption']}]"
            turns.append(
                Turn(str(turn["dia_id"]), text, start + timedelta(seconds=n), f"{path.stem}/session_{number}")
            )
    known = {t.dia_id for t in turns}
    questions = []
    for qa in data["qa"]:
        category = int(qa.get("category", 0))
        evidence = frozenset(str(e) for e in qa.get("evidence", []) if str(e) in known)
        if category == 5 or not evidence:
            continue
        questions.append(Question(str(qa["question"]), evidence, category))
    return Conversation(path.stem, turns, questions)


def load_conversations() -> tuple[list[Conversation] | None, str]:
    """The conversations, or ``None`` and the reason they cannot be read."""
    folder = data_dir()
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return None, f"no LoCoMo conversations in {folder} (set BENCH_LOCOMO_DIR)"
    return [_load(path) for path in files], f"{len(files)} conversations from {folder}"
