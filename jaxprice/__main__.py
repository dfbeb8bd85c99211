import sys

from jaxprice.cli import main

sys.exit(main())
