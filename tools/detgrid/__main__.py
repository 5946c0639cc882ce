import sys

from detgrid.kit.cli import main

sys.exit(main())
