#!/usr/bin/env python3
"""Prints the README's flag table, made from otel_vgpu/config.py's FLAGS (tests/test_docs.py
checks that the README holds exactly this): .venv/bin/python scripts/gen-flag-table.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.config import flags_markdown

print(flags_markdown(), end="")
