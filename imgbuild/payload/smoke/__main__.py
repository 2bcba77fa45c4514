"""Start the smoke test: `python3 FOLDER` (this package copied into an image as a folder), `python3 -m PACKAGE`,
or a probe's launcher running the folder with runpy. Run as a folder, the folder itself is first on sys.path:
it is replaced by its parent, so the modules import as the package they are (never as top-level names that
could shadow the image's own) and the package's name is the folder's."""

import importlib
import os
import sys

if __package__:
    main = importlib.import_module(__package__ + ".main").main
else:
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == _here:
        sys.path[0] = os.path.dirname(_here)
    else:
        sys.path.insert(0, os.path.dirname(_here))
    main = importlib.import_module(os.path.basename(_here) + ".main").main

sys.exit(main(sys.argv[1:]))
