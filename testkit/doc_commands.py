"""The shell commands the docs show, so that CI can hold them to what they say.

A command is a line of a fenced `sh` block (continuation lines joined, the
trailing comment dropped), or an inline code span in prose that starts like a
command (`.venv/bin/...`, `python3 ...`, `kubectl ...`). Each is checked
without running it (`problems`): the block parses (`bash -n`), the files and
folders of this repository it names exist, the Python tools it calls
are the ones the README installs (`.venv/bin/...`: a bare `python` or
`pytest` has none of the packages), and an image build (`docker` or `podman`)
has its context and Dockerfile here and tags what its block pushes. Which
commands are run as written, and how, is the test's business
(tests/system/test_doc_commands.py).
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
# The image builders the docs show; neither runs here (no daemon, no registry), so a build is
# held to what it names and a push to what its block built.
BUILDERS = ("docker", "podman")
# Their build options that take a value (docker build --help, podman build --help): the rest of
# a build's words are flags, and its one positional word is the context.
_BUILD_VALUE_OPTIONS = {
    "-t",
    "--tag",
    "-f",
    "--file",
    "--build-arg",
    "--platform",
    "--target",
    "--label",
    "--network",
    "--secret",
    "--cache-from",
    "--cache-to",
    "-o",
    "--output",
    "--iidfile",
    "--progress",
    "--format",
}


@dataclass(frozen=True, slots=True)
class ImageBuild:
    """What a `docker build` or `podman build` line says: where from, and the tags it makes."""

    context: str
    dockerfile: str | None
    """As `-f` gives it; None: the context's own Dockerfile."""
    tags: tuple[str, ...]


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
        found += _image_problems(argv, command, root)
    return found


def image_build(argv: list[str]) -> ImageBuild | None:
    """The build an argv runs, if it is `docker build` or `podman build`; ValueError where it
    names no context, or more than one."""
    if argv[0] not in BUILDERS or argv[1:2] != ["build"]:
        return None
    positional: list[str] = []
    options: dict[str, list[str]] = {}
    rest = iter(argv[2:])
    for token in rest:
        name, inline, value = token.partition("=")
        if token.startswith("-") and name in _BUILD_VALUE_OPTIONS:
            options.setdefault(name, []).append(value if inline else next(rest, ""))
        elif not token.startswith("-"):
            positional.append(token)
    if len(positional) != 1:
        raise ValueError(f"a build names one context, this one {positional or 'none'}")
    files = options.get("-f", []) + options.get("--file", [])
    return ImageBuild(
        positional[0], files[-1] if files else None, tuple(options.get("-t", []) + options.get("--tag", []))
    )


def pushed_image(argv: list[str]) -> str | None:
    """The image an argv pushes, if it is `docker push` or `podman push`."""
    if argv[0] not in BUILDERS or argv[1:2] != ["push"]:
        return None
    images = [a for a in argv[2:] if not a.startswith("-")]
    return images[0] if images else ""


def _image_problems(argv: list[str], command: DocCommand, root: Path) -> list[str]:
    if command.block is None:
        return []  # prose names a builder in passing (`podman build` works too); a block is what one runs
    try:
        build = image_build(argv)
    except ValueError as error:
        return [str(error)]
    if build is not None:
        context = root / build.context
        if not context.is_dir():
            return [f"builds from {build.context!r}, which is no folder of the repository"]
        dockerfile = root / build.dockerfile if build.dockerfile else context / "Dockerfile"
        if not dockerfile.is_file():
            return [f"builds with {dockerfile.relative_to(root)}, which is not in the repository"]
        return []
    image = pushed_image(argv)
    if image is None:
        return []
    built = {tag for c in block_commands(command) for argv in words(c) if (b := image_build(argv)) for tag in b.tags}
    if image not in built:
        return [f"pushes {image!r}, which no build of its block tags ({sorted(built) or 'none'})"]
    return []


def block_commands(command: DocCommand) -> list[str]:
    """Every command of the block `command` came from (itself alone for an inline span)."""
    if command.block is None:
        return [command.text]
    return [c.text for c in _block_commands(command.doc, command.line, command.block)]


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
