"""A class's answers, for the teacher's view: per stop of the lesson, how many learners answered,
how many were right, and the spread of their first answers. Anonymous: a learner is a random id
the browser made (localStorage), and only answers are counted, never who gave which.

A class is a short code a teacher makes for one lesson (`/lessons/<id>?class=<code>` is the link
the learners open). In a classroom (`ggml-lens serve --queue redis://…`) the counts are kept in
that Redis, so every web process adds to and reads the same counts (`RedisTally`); a single
process keeps them in memory (`MemoryTally`). A server of several processes without Redis keeps
none (the teacher's page says so).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Protocol

from redis import Redis

KEY = "ggml-lens:class:"  # + code: the lesson it is for; + code:stop:…: its counts
CLASS_TTL = 24 * 3600  # s a class and its counts are kept after it is made
CODE_BYTES = 4  # a code is 8 hex digits
MAX_LEARNERS = 1000  # learners counted per stop of a class (the ids are the browsers' own)


@dataclass(frozen=True, slots=True)
class StopTally:
    answered: int  # learners who answered the stop
    right: int  # of them, those whose first answer was right
    answers: tuple[tuple[str, int], ...]  # each first answer and how many gave it, the most given first


def new_code() -> str:
    return secrets.token_hex(CODE_BYTES)


class Tally(Protocol):
    def open_class(self, lesson: str) -> str: ...  # a new class's code
    def lesson_of(self, code: str) -> str | None: ...  # the lesson a class is for (None: no such class)
    def count(self, code: str, stop: int, learner: str, said: str, right: bool) -> None: ...
    def stops(self, code: str, n_stops: int) -> list[StopTally]: ...


def _sorted(answers: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(answers.items(), key=lambda kv: (-kv[1], kv[0])))


class MemoryTally:
    """The counts of a single process's classes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lessons: dict[str, str] = {}
        self._first: dict[tuple[str, int], dict[str, tuple[str, bool]]] = {}  # learner -> first answer

    def open_class(self, lesson: str) -> str:
        code = new_code()
        with self._lock:
            self._lessons[code] = lesson
        return code

    def lesson_of(self, code: str) -> str | None:
        with self._lock:
            return self._lessons.get(code)

    def count(self, code: str, stop: int, learner: str, said: str, right: bool) -> None:
        with self._lock:
            first = self._first.setdefault((code, stop), {})
            if code in self._lessons and len(first) < MAX_LEARNERS:
                first.setdefault(learner, (said, right))

    def stops(self, code: str, n_stops: int) -> list[StopTally]:
        out = []
        with self._lock:
            for stop in range(n_stops):
                first = self._first.get((code, stop), {})
                answers: dict[str, int] = {}
                for said, _right in first.values():
                    answers[said] = answers.get(said, 0) + 1
                out.append(StopTally(len(first), sum(r for _s, r in first.values()), _sorted(answers)))
        return out


class RedisTally:
    """The counts in a classroom's Redis: per stop a hash of each learner's first answer
    (HSETNX: a learner counts once), a hash of how many gave each answer, and a count of the
    right ones; all expire with the class."""

    def __init__(self, url: str) -> None:
        self.redis = Redis.from_url(url)

    def open_class(self, lesson: str) -> str:
        code = new_code()
        self.redis.set(KEY + code, lesson, ex=CLASS_TTL)
        return code

    def lesson_of(self, code: str) -> str | None:
        found = self.redis.get(KEY + code)
        return found.decode() if isinstance(found, bytes) else found

    def count(self, code: str, stop: int, learner: str, said: str, right: bool) -> None:
        ttl = self.redis.ttl(KEY + code)
        if ttl is None or ttl <= 0:  # no such class (or it expired)
            return
        at = f"{KEY}{code}:{stop}:"
        if self.redis.hlen(at + "who") >= MAX_LEARNERS:
            return
        if self.redis.hsetnx(at + "who", learner, said):  # this learner's first answer
            with self.redis.pipeline() as p:
                p.hincrby(at + "said", said, 1)
                if right:
                    p.incr(at + "right")
                for key in ("who", "said", "right"):
                    p.expire(at + key, ttl)
                p.execute()

    def stops(self, code: str, n_stops: int) -> list[StopTally]:
        with self.redis.pipeline() as p:
            for stop in range(n_stops):
                at = f"{KEY}{code}:{stop}:"
                p.hlen(at + "who")
                p.hgetall(at + "said")
                p.get(at + "right")
            got = p.execute()
        out = []
        for stop in range(n_stops):
            answered, said, right = got[3 * stop: 3 * stop + 3]
            out.append(StopTally(int(answered), int(right or 0),
                                 _sorted({k.decode(): int(v) for k, v in said.items()})))
        return out
