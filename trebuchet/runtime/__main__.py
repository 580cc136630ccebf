"""`python -m trebuchet.runtime VERB ...`, and the entry of the shipped .pyz."""

import sys

if sys.version_info < (3, 8):  # noqa: UP036 - this check is for the nodes' interpreters
    sys.stderr.write(
        "treb: the node agent needs python3 >= 3.8, found %s\n" % sys.version.split()[0]  # noqa: UP031
    )
    sys.exit(127)

from .command_line import main  # noqa: E402

sys.exit(main())
