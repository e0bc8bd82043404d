"""Files, read and written safely: atomic writes and fsyncs (atomic), where Arbor keeps its
data (paths), reading only regular files up to a limit (regular), and strict JSON."""
