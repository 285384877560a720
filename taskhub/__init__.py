"""taskhub: the human control room for long-running MCP tool calls."""
