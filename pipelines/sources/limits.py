"""The bounds on every corpus row, in a module of their own so that the CLI's parser can
state them as defaults without importing pyarrow (``funnel --help`` stays light)."""

#: A field's value may nest this many containers (``[]``/``{}``) deep. Python's json parser
#: recurses once per level and raises RecursionError near 1,000 levels, so depth is checked
#: on the raw line before parsing, and the configurable bound stays well below that.
DEFAULT_MAX_DEPTH = 64
MAX_DEPTH_CAP = 512
#: UTF-8 bytes of one field (id, title, text, or any other field of a JSONL row): a long book
#: is a few MB; much more is a dump or a mistake that would fill a reader's and a shard's memory.
DEFAULT_MAX_FIELD_BYTES = 16 << 20
#: Bytes of one row: a JSONL line; for Parquet, the id, title and text it reads.
DEFAULT_MAX_ROW_BYTES = 32 << 20
