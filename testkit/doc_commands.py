"""The shell commands the docs show, so that CI can hold them to what they say.

A command is a line of a fenced `sh` block (continuation lines joined, the
trailing comment dropped), or an inline code span in prose that starts like a
command (`.venv/bin/...`, `python3 ...`, `kubectl ...`). Each is checked
without running it (`problems`): the block parses (`bash -n`), the files and
folders of this repository it names exist, and the Python tools it calls
are the ones the README installs (`.venv/bin/...`: a bare `python` or
`pytest` has none of the packages). Which commands are run as written, and
how, is the test's business (tests/test_doc_commands.py).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Where users read commands.
DOCS = (
    "README.md",
    "docs/*.md",
    "kustomize/README.md",
    "collector-config/**/*.md",
    "bench/README.md",
    "charts/*/README.md",
)

_FENCE = re.compile(r"^```(sh|bash|shell|console)\n(.*?)^```", re.S | re.M)
_ANY_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(
    r"`((?:\.venv/bin/|\./scripts/|python3? |pytest |pip |kubectl |helm |promtool |curl |docker |podman )[^`]*)`"
)
# Tokens that are not paths of this repository: options, URLs, variables, placeholders,
# absolute paths of the machine it runs on, images.
_NOT_A_PATH = re.compile(r"^(-|\$|<|http|oci://|/|~|registry\.|[\w.-]+:[\w.-]+$|[\w.-]+:\d+(/|$))|[=*?{}\[\]<>$]")
# What runs on a GPU node as root, with that machine's own python3 (bench/README.md).
_GPU_SCRIPT = re.compile(r"^bench/gpu_\w+\.py$")
# Options whose value is no file of this repository: a file the command writes,
# which need not exist yet, or an API's group/version/Kind (helm --api-versions).
_OUTPUT_OPTIONS = {"--out", "-o", "--output", "-t", "--api-versions"}


@dataclass(frozen=True, slots=True)
class DocCommand:
    doc: Path
    line: int
    text: str
    """The command, one line, without its trailing comment."""
    block: str | None
    """The whole fenced block it came from; None for an inline span."""

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    found: list[Path] = []
    for pattern in DOCS:
        found += sorted(root.glob(pattern))
    return found


def commands(doc: Path) -> list[DocCommand]:
    """Every command `doc` shows, fenced or inline, in order."""
    text = doc.read_text()
    found: list[DocCommand] = []
    for match in _FENCE.finditer(text):
        first_line = text.count("\n", 0, match.start(2)) + 1
        block = match.group(2)
        found += _block_commands(doc, first_line, block)
    prose = _ANY_FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in _INLINE.finditer(prose):
        line = prose.count("\n", 0, match.start()) + 1
        found.append(DocCommand(doc, line, " ".join(match.group(1).split()), None))
    return sorted(found, key=lambda c: c.line)


def _block_commands(doc: Path, first_line: int, block: str) -> Iterable[DocCommand]:
    pending, start = "", first_line
    for offset, raw in enumerate(block.splitlines()):
        if not pending:
            start = first_line + offset
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = _without_comment(pending + line).strip()
        pending = ""
        if whole:
            yield DocCommand(doc, start, whole, block)


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a comment (outside quotes, after a space)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def words(command: str) -> list[list[str]]:
    """The simple commands of a line (split at `&&`, `||`, `;` and `|`), each as its words."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    simple: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            simple.append([])
        else:
            simple[-1].append(token)
    return [s for s in simple if s]


def problems(command: DocCommand, root: Path = ROOT) -> list[str]:
    """What is wrong with a command without running it; empty when nothing is."""
    found: list[str] = []
    if command.block is not None:
        parsed = subprocess.run(["bash", "-n"], input=command.block, capture_output=True, text=True, check=False)
        if parsed.returncode != 0:
            found.append(f"does not parse as shell: {parsed.stderr.strip()}")
    try:
        simple_commands = words(command.text)
    except ValueError as error:
        return [*found, f"cannot be split into words: {error}"]
    for argv in simple_commands:
        found += _tool_problems(argv)
        found += _path_problems(argv, command.doc, root)
    return found


def _tool_problems(argv: list[str]) -> list[str]:
    program = argv[0]
    if program in ("python", "pytest", "pip", "ruff", "mypy"):
        return [
            f"runs a bare {program!r}: the packages are in the virtual environment the README makes; "
            f"write .venv/bin/{program}"
        ]
    if program == "python3":
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        if argv[1:3] not in (["-m", "venv"], ["-m", "pip"]) and not _GPU_SCRIPT.match(script):
            return [
                "runs python3 outside the virtual environment (only `python3 -m venv`, and on a GPU "
                "node `python3 -m pip` and the bench/gpu_*.py scripts, do): write .venv/bin/python"
            ]
    return []


def _path_problems(argv: list[str], doc: Path, root: Path) -> list[str]:
    found = []
    skip_next = False
    for index, token in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        if token in _OUTPUT_OPTIONS or token in (">", ">>"):
            skip_next = True
            continue
        if index == 0 and token.startswith(".venv/"):
            continue  # made by the README's first command
        if "/" not in token or _NOT_A_PATH.search(token):
            continue
        if argv[0] == "kubectl" and not (
            argv[index - 1] in ("-k", "--kustomize", "-f", "--filename") or argv[1:2] == ["kustomize"]
        ):
            continue  # a resource (pod/name), not a file: kubectl reads files only after -k, -f, kustomize
        if not ((root / token).exists() or (doc.parent / token).exists()):
            found.append(f"names {token!r}, which is not in the repository")
    return found
