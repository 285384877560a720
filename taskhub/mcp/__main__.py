"""`python -m taskhub.mcp`: see :mod:`taskhub.mcp.cli`."""

from taskhub.mcp.cli import main

raise SystemExit(main())
