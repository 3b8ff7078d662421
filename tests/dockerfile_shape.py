"""The shape of a Dockerfile: what a value must never change.

`parse` splits a Dockerfile the way BuildKit's parser does for what imageforge writes:
comments, instructions, backslash continuations (comment lines inside them dropped) and
heredocs (`<<EOF`, `<<-'EOF'`, several per instruction). `shape` keeps, per instruction,
its keyword and the shell structure of its text: every operator, expansion, glob, comment and
the number of words between operators, all outside quotes, the way `sh` reads them. Two
renders whose values differ only inside quoted words have the same shape; a value that adds
an instruction, a command, a word, a redirection or a substitution does not.
"""

from __future__ import annotations

import dataclasses
import re

KEYWORDS = frozenset({"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM",
                      "HEALTHCHECK", "LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL",
                      "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"})
HEREDOC_KEYWORDS = frozenset({"ADD", "COPY", "RUN"})
# A heredoc is a whole shell word, its quotes kept (BuildKit's heredocsFromLine lexes the line
# with raw quotes, then matches each word): '0<<A' is a quoted word, not a heredoc.
HEREDOC = re.compile(r"\d*<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
OPERATORS = ("&&", "||", ";;", ">>", "<<", "<&", ">&", "<>", ">|", "&", "|", ";", "(", ")",
             "<", ">")


class ParseError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Instruction:
    keyword: str
    text: str  # the arguments, continuations joined
    heredocs: tuple[str, ...] = ()


def parse(dockerfile: str) -> list[Instruction]:
    lines = dockerfile.split("\n")
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        joined = line
        while joined.endswith("\\"):
            joined = joined[:-1]
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1  # a comment inside a continuation is dropped
            if i == len(lines):
                break
            joined += lines[i]
            i += 1
        keyword, _, text = joined.strip().partition(" ")
        if keyword.upper() not in KEYWORDS:
            raise ParseError(f"not an instruction: {joined!r}")
        bodies = []
        if keyword.upper() in HEREDOC_KEYWORDS:
            for dash, _, name in (m.groups() for m in map(HEREDOC.fullmatch, raw_words(text))
                                  if m):
                body = []
                while i < len(lines) and (lines[i].lstrip("\t") if dash else lines[i]) != name:
                    body.append(lines[i])
                    i += 1
                if i == len(lines):
                    raise ParseError(f"heredoc {name} is never closed")
                i += 1
                bodies.append("\n".join(body))
        out.append(Instruction(keyword.upper(), text, tuple(bodies)))
    return out


def raw_words(text: str) -> list[str]:
    """`text` split at blanks outside quotes, each word with its quotes kept."""
    words, word, quote = [], "", ""
    for c in text:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in " \t":
            if word:
                words.append(word)
            word = ""
            continue
        word += c
    return [*words, word] if word else words


def shell_shape(script: str) -> tuple[str, ...]:
    """Operators, expansions, globs and comments outside quotes, with the word counts between
    them (`w3`), in order."""
    tokens: list[str] = []
    words = 0
    in_word = False
    i = 0

    def end_word() -> None:
        nonlocal words, in_word
        if in_word:
            words += 1
            in_word = False

    def mark(token: str) -> None:
        nonlocal words
        end_word()
        tokens.extend([f"w{words}", token])
        words = 0

    while i < len(script):
        c = script[i]
        if c == "'":
            end = script.find("'", i + 1)
            if end < 0:
                return (*tokens, "unterminated '")
            i, in_word = end + 1, True
        elif c == '"':
            i += 1
            while i < len(script) and script[i] != '"':
                if script[i] == "\\":
                    i += 2
                    continue
                if script[i] in "$`":
                    tokens.append("quoted " + _expansion(script, i))
                i += 1
            if i >= len(script):
                return (*tokens, 'unterminated "')
            i, in_word = i + 1, True
        elif c == "\\":
            i, in_word = i + 2, True
        elif c in "$`":
            tokens.append(_expansion(script, i))
            i, in_word = i + 1, True
        elif c in " \t":
            end_word()
            i += 1
        elif c == "\n":
            mark("newline")
            i += 1
        elif c == "#" and not in_word:
            end = script.find("\n", i)
            mark("comment")
            i = len(script) if end < 0 else end
        elif c in "*?[" or (c == "~" and not in_word):
            tokens.append(f"glob {c}")
            i, in_word = i + 1, True
        else:
            op = next((o for o in OPERATORS if script.startswith(o, i)), None)
            if op is None:
                i, in_word = i + 1, True
            else:
                mark(op)
                i += len(op)
    end_word()
    tokens.append(f"w{words}")
    return tuple(tokens)


def _expansion(script: str, i: int) -> str:
    if script[i] == "`":
        return "`"
    following = script[i + 1:i + 2]
    return "$" + following if following in ("(", "{") else "$"


def shape(dockerfile: str) -> list[tuple[object, ...]]:
    return [(ins.keyword, shell_shape(ins.text),
             tuple(shell_shape(body) if ins.keyword == "RUN" else len(body.split("\n"))
                   for body in ins.heredocs))
            for ins in parse(dockerfile)]
