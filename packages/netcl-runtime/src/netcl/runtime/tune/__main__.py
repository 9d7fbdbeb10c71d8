"""``python -m netcl.runtime.tune``: the tile search's command line (``netcl.runtime.tune.main``).

A package's ``__main__`` so that running it does not re-execute the module the runtime has already
imported (runpy's "found in sys.modules" warning).
"""

from netcl.runtime.tune import main

main()
