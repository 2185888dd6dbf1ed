from __future__ import annotations

import sys

from tilepilot.cli import main

sys.exit(main())
