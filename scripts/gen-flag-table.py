#!/usr/bin/env python3
"""Rewrites the flag table of docs/flags.md from otel_vgpu/config.py's FLAGS, which `--help` is made
from too (tests/system/test_docs.py checks that the doc holds exactly this):
.venv/bin/python scripts/gen-flag-table.py"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_blocks import write_block

from otel_vgpu.flag_table import flags_markdown

write_block("flag table", flags_markdown())
