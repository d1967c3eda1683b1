import sys

from hotline.cli import main

sys.exit(main())
