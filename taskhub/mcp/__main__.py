"""`python -m taskhub.mcp`: see :mod:`taskhub.mcp.cli`."""

from taskhub.mcp.cli_args import main

raise SystemExit(main())
