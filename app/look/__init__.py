"""How the window looks and what it can do: theme, icons, accessibility and the action table."""
