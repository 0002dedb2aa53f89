#!/usr/bin/env python3
"""Rewrites the metric tables of docs/metrics.md from otel_vgpu/export/families.py's table, and
its lists made from the same declarations (scripts/family_lists.py: the health and GPM denylist,
the families each read is made for, the collection stages); tests/system/test_docs.py checks that the
doc holds exactly these: .venv/bin/python scripts/gen-metric-tables.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_blocks import write_block
from family_lists import BLOCKS

from otel_vgpu.export.families import families_markdown

write_block("metric tables", families_markdown())
for name, markdown in BLOCKS.items():
    write_block(name, markdown())
