import sys

from pagedserve.benchmarks.device.check import main

sys.exit(main())
