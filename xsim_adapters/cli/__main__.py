"""``python -m xsim_adapters.cli``: the ``xsim`` command."""

import sys

from .main import main

sys.exit(main())
