#!/usr/bin/env python3
"""Rewrites the metric tables of docs/metrics.md from otel_vgpu/export/families.py's table
(tests/test_docs.py checks that the doc holds exactly this): .venv/bin/python scripts/gen-metric-tables.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_blocks import write_block

from otel_vgpu.export.families import families_markdown

write_block("metric tables", families_markdown())
