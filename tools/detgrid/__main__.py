import sys

from detgrid.cli import main

sys.exit(main())
