"""The tree panel: a Qt-free layout (tree_layout), keyboard moves (tree_navigation) and the
widget (tree_panel)."""
