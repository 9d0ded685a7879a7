from __future__ import annotations

import sys

from slices.agent.nvml_agent import main

sys.exit(main())
