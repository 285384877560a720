"""The MCP gateway: agents call the tools of taskhub's servers through taskhub (protocol 2026-07-28, the Tasks
extension on the server side). Every `tools/call` becomes a taskhub Task; `tasks/*` are answered from Postgres."""
