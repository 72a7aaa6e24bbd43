"""The fenced code blocks of a Markdown document, with their doc-test
annotations (the convention is in ``tests/docs/README.md``).

Parsing is pure: it reads text and returns ``Document``, whose blocks carry
every problem found in them (an unknown directive, a skip without a reason,
a block with no language) instead of raising, so each problem is reported by
the test of the block it belongs to.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

KINDS = {
    "python": "python",
    "py": "python",
    "sh": "sh",
    "bash": "sh",
    "shell": "sh",
    "console": "console",
    "toml": "toml",
    "cron": "cron",
    "crontab": "cron",
    "sql": "sql",
}
"""Languages whose blocks are run, by the kind of run each gets."""

DISPLAY = frozenset({"text", "json", "diff"})
"""Languages that are only read: output, diagrams, payloads. Add one here only
for something that cannot be pasted anywhere."""

DIRECTIVES_OF = {
    "python": {"file", "exit", "timeout", "env", "replace", "stand-in"},
    "sh": {"file", "exit", "timeout", "env", "replace", "stand-in", "runs-for"},
    "console": {"timeout", "env", "replace", "stand-in"},
    "toml": {"file", "exit", "env", "replace", "stand-in"},
    "cron": {"exit", "timeout", "env", "replace", "stand-in"},
    "sql": {"replace"},
}
"""Which directives each kind takes (``skip`` goes on any block)."""

PLACEHOLDERS = ("{dir}", "{postgres}", "{redis}", "{schema}", "{postgres_dsn}", "{redis_dsn}", "{prefix}")
"""What ``replace``'s and ``env``'s values may name (see the README)."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ANNOTATION = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")
_LOOKS_LIKE_ANNOTATION = re.compile(r"<!--.*\bdoc[-_ ]?tests?\b", re.IGNORECASE)
_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>ms|s|m)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}


def seconds(text: str) -> float | None:
    """``"250ms"``, ``"2s"``, ``"1.5m"`` in seconds; None if it is not one."""
    m = _DURATION.match(text.strip())
    return float(m["n"]) * _UNITS[m["unit"]] if m else None


@dataclass
class Directives:
    """What the annotations above one fence say."""

    skip: str | None = None
    """The reason the block is not run."""
    file: str | None = None
    exit: int = 0
    runs_for: float | None = None
    timeout: float | None = None
    env: list[tuple[str, str]] = field(default_factory=list)
    replace: list[tuple[str, str]] = field(default_factory=list)
    stand_ins: list[str] = field(default_factory=list)
    given: list[str] = field(default_factory=list)
    """The directive names, in the order written."""


@dataclass
class Block:
    doc: str
    """The document's path, relative to the repository."""
    start: int
    """Line of the opening fence (1-based)."""
    end: int
    """Line of the closing fence."""
    lang: str
    text: str
    directives: Directives
    problems: list[str]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.start}-{self.end}"

    @property
    def kind(self) -> str | None:
        """How the block is run, or None for a block that is only read."""
        return KINDS.get(self.lang)

    @property
    def tested(self) -> bool:
        """Whether the block gets a test case: every runnable block, and
        every block with something wrong in it."""
        return self.kind is not None or bool(self.problems)


@dataclass
class Document:
    path: str
    blocks: list[Block]
    problems: list[str]
    """Problems outside any block: a dangling annotation, an open fence."""


def parse_document(path: str, text: str) -> Document:
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: list[tuple[int, str]] = []  # annotations waiting for their fence: (line, body)
    i = 0
    while i < len(lines):
        line = lines[i]
        number = i + 1
        note = _ANNOTATION.match(line)
        if note:
            pending.append((number, note["body"]))
            i += 1
            continue
        if _LOOKS_LIKE_ANNOTATION.search(line):
            problems.append(
                f"{path}:{number}: malformed annotation; expected <!-- doc-test: DIRECTIVE; … -->"
            )
        fence = _FENCE.match(line)
        if not fence:
            problems.extend(
                f"{path}:{n}: annotation is not directly above a fence (line {number} comes between)"
                for n, _ in pending
            )
            pending = []
            i += 1
            continue
        indent, marker = fence["indent"], fence["fence"]
        lang = fence["info"].strip().split(maxsplit=1)[0].lower() if fence["info"].strip() else ""
        close = re.compile(rf"^[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if j == len(lines):
            problems.append(f"{path}:{number}: fence is never closed")
            break
        body = [_dedent(text_line, indent) for text_line in lines[i + 1 : j]]
        directives, block_problems = parse_directives(pending)
        block = Block(
            doc=path,
            start=number,
            end=j + 1,
            lang=lang,
            text="\n".join(body) + ("\n" if body else ""),
            directives=directives,
            problems=block_problems,
        )
        block.problems.extend(_language_problems(block))
        blocks.append(block)
        pending = []
        i = j + 1
    problems.extend(f"{path}:{n}: annotation is not directly above a fence (end of file)" for n, _ in pending)
    return Document(path=path, blocks=blocks, problems=problems)


def _dedent(line: str, indent: str) -> str:
    """A fence indented in a list item indents its content as much."""
    return line[len(indent) :] if line.startswith(indent) else line.lstrip(" \t")


def parse_directives(annotations: list[tuple[int, str]]) -> tuple[Directives, list[str]]:
    d = Directives()
    problems: list[str] = []
    for number, body in annotations:
        for raw in _split(body):
            text = raw.strip()
            if not text:
                problems.append(f"line {number}: empty directive")
                continue
            name = re.split(r"[\s=(]", text, maxsplit=1)[0]
            rest = text[len(name) :].strip()
            why = _apply(d, name, rest)
            if why:
                problems.append(f"line {number}: {why}")
            else:
                d.given.append(name)
    return d, problems


def _split(body: str) -> list[str]:
    """Directives are separated by ``;``, except inside a skip's parentheses."""
    parts, depth, current = [], 0, ""
    for char in body:
        if char == ";" and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    parts.append(current)
    return parts


def _apply(d: Directives, name: str, rest: str) -> str | None:
    """Records one directive in ``d``; returns what is wrong with it, if anything."""
    value = rest[1:].strip() if rest.startswith("=") else None
    if name == "skip":
        m = re.fullmatch(r"\((.*)\)", rest)
        if not m or not m[1].strip():
            return "skip needs a reason in parentheses: skip (output of the command above)"
        d.skip = m[1].strip()
    elif name == "file":
        if not value or value.startswith("/") or ".." in value.split("/"):
            return "file= needs a path inside the document's directory, e.g. file=cronwarden.toml"
        d.file = value
    elif name == "exit":
        if value is None or not value.isdigit() or int(value) > 255:
            return f"exit= needs a status 0-255, got {rest!r}"
        d.exit = int(value)
    elif name in ("runs-for", "timeout"):
        duration = seconds(value) if value is not None else None
        if duration is None or duration <= 0:
            return f"{name}= needs a duration like 2s or 500ms, got {rest!r}"
        if name == "runs-for":
            d.runs_for = duration
        else:
            d.timeout = duration
    elif name == "env":
        env_name, eq, env_value = rest.partition("=")
        if not eq or not _ENV_NAME.match(env_name):
            return f"env needs NAME=VALUE, got {rest!r}"
        d.env.append((env_name, env_value))
    elif name == "replace":
        old, arrow, new = rest.partition(" => ")
        if not arrow or not old.strip():
            return f"replace needs OLD => NEW, got {rest!r}"
        d.replace.append((old.strip(), new.strip()))
    elif name == "stand-in":
        words = shlex.split(rest) if rest else []
        if len(words) != 1 or not (words[0].startswith("/") or words[0].startswith("./")) or ".." in words[0]:
            return f"stand-in needs one path, /ABSOLUTE or ./RELATIVE, e.g. /opt/bin/reconcile, got {rest!r}"
        d.stand_ins.append(words[0])
    else:
        known = "skip, file, exit, runs-for, timeout, env, replace, stand-in"
        return f"unknown directive {name!r}; known: {known}"
    return None


def _language_problems(block: Block) -> list[str]:
    d = block.directives
    if not block.lang:
        if d.skip:
            return []
        return ["the fence names no language: write ```text for output or a diagram, or say its language"]
    kind = block.kind
    if kind is None:
        if block.lang in DISPLAY or d.skip:
            return []
        return [
            f"language {block.lang!r} is neither runnable ({', '.join(sorted(set(KINDS)))}) nor read-only "
            f"({', '.join(sorted(DISPLAY))}); annotate it skip (reason) or add it to one of them"
        ]
    if d.skip:
        others = [n for n in d.given if n != "skip"]
        return [f"skip takes no other directive, got {', '.join(others)}"] if others else []
    wrong = [n for n in d.given if n not in DIRECTIVES_OF[kind]]
    problems = [f"{n} does not apply to a {kind} block" for n in dict.fromkeys(wrong)]
    if d.runs_for is not None and d.file is not None:
        problems.append("runs-for and file= exclude each other: a written file is not run")
    if kind == "sh" and d.file is None and any(line.startswith("$ ") for line in block.text.splitlines()):
        problems.append("a shell block holds a prompt ('$ '): make it ```console, or drop the prompts")
    return problems
