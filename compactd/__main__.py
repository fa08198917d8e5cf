from compactd.main import main

raise SystemExit(main())
