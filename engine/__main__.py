"""``python -m engine``: the engine's command-line tools (generate, chat, info, convert, eval, serve, bench);
the workbench opens with ``python -m strata`` or ``main.py``."""
import sys

from engine.cli.main import main

sys.exit(main())
