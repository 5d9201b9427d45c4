from services.bench.cli import main

raise SystemExit(main())
