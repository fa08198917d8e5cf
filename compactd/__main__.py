from compactd.clients.cli import main

raise SystemExit(main())
