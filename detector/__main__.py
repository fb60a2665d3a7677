import sys

from hpcsec.detector.cli.main import main

sys.exit(main())
