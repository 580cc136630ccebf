"""`python -m trebuchet` is `treb`."""

import sys

from trebuchet.cli.main import main

sys.exit(main())
