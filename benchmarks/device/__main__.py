import sys

from benchmarks.device.check import main

sys.exit(main())
