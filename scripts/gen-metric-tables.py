#!/usr/bin/env python3
"""Prints the README's metric tables, made from otel_vgpu/export/families.py's table (tests/test_docs.py
checks that the README holds exactly this): .venv/bin/python scripts/gen-metric-tables.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otel_vgpu.export.families import families_markdown

print(families_markdown(), end="")
