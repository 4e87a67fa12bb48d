from hotspan.cli import main

raise SystemExit(main())
