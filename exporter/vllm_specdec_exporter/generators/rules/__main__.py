"""python -m vllm_specdec_exporter.generators.rules: see command.py."""

import sys

from .command import main

sys.exit(main())
