from infermux.cli import main

raise SystemExit(main())
