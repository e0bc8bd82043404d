"""The user's MCP servers: their tools, listed and called off the GUI thread."""
