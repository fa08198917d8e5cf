"""compactd subpackage."""
