from pagedserve.benchmarks.cli import main

raise SystemExit(main())
