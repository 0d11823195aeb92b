"""``python -m skiplock`` runs the command line.

For ``-m`` Python puts the current directory first on ``sys.path``. It is dropped here, before the
command line's imports, so that a file there (``click.py``, ``wave.py``) cannot shadow an installed
or standard module; the command line adds the directory back -- last -- only to import ``--app``
(see ``skiplock.cli.group.import_object``). Modules imported before this point (``import skiplock`` and its
dependencies) were found the way Python finds them: ``python -P -m skiplock`` keeps the current
directory off the path from the start.
"""

import os
import sys

if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.getcwd():
    del sys.path[0]

from skiplock.cli import main  # noqa: E402 - after the path fix above

main()
