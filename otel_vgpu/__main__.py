from otel_vgpu.cli import main

raise SystemExit(main())
