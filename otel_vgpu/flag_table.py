"""The flag table of docs/flags.md, made from config.py's FLAGS and the parser, so that it says
what `--help` says (scripts/gen-flag-table.py writes it; tests/system/test_docs.py checks it)."""

from __future__ import annotations

from otel_vgpu.config import FLAGS, HELP_HELP, VERSION_HELP, build_parser


def flags_markdown() -> str:
    """The table: each flag as --help spells it, the variables that stand for it, its default, its help."""
    rows = ["| flag | environment | default | |", "|---|---|---|---|"]
    parser = build_parser()
    # Each flag spelled as --help spells it (its metavar, or its choices).
    invocation = {
        action.option_strings[-1]: parser._get_formatter()._format_action_invocation(action)
        for action in parser._actions
    }
    for flag in FLAGS:
        env = " or ".join(f"`{name}`" for name in flag.variables())
        # Markdown would take <pid> for a tag and a lone * for emphasis.
        text = flag.help.replace("<", "\\<").replace("*", "\\*").replace("|", "\\|")
        rows.append(f"| `{invocation[flag.name]}` | {env} | `{flag.default_text()}` | {text} |")
    rows.append(f"| `--version` | | | {VERSION_HELP} |")
    rows.append(f"| `-h`, `--help` | | | {HELP_HELP} |")
    return "\n".join(rows) + "\n"
