"""A real MCP server implementing the server side of the MCP Tasks extension, for demos and tests.

Run it with `python -m taskhub.demo --http --port 0` or `python -m taskhub.demo --stdio`; the interface is
fixed in docs/demo-server-contract.md. Depends only on the `mcp` SDK and the standard library.
"""
