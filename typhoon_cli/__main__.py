"""``python -m typhoon_cli``: the same as the ``typhoon`` command."""

import sys

from typhoon_cli import main

sys.exit(main())
